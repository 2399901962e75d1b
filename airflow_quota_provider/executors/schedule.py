"""The scheduler: builds each job queue's policy state from the tables and the launcher's hosts, and
asks the policy core what to do. Acting on the answer is :mod:`.act`'s."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy import and_, select, update

from airflow_quota_provider.executors.launcher import HostDevices
from airflow_quota_provider.models.coordination import UNQUEUED
from airflow_quota_provider.models.gang import waits_for_backoff
from airflow_quota_provider.models.job import ActiveJob, JobState, QuotaJob, QuotaPreemptionCount, active_job_rows, policy_job
from airflow_quota_provider.policy import Decision, Host, Job, Queue, State, decide
from airflow_quota_provider.policy.backlog import Backlog

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_quota_provider.executors.cycle import Cycle
    from airflow_quota_provider.executors.launcher import Launcher
    from airflow_quota_provider.executors.runtimes import CheckpointTimes


log = logging.getLogger(__name__)

NO_HOST = "(no GPU host registered yet)"
_DECIDED_ON = ActiveJob._fields.index("pending_reason")
"""The columns of :class:`ActiveJob` that the policy's view of a job depends on come first."""
_PENDING = JobState.PENDING.value  # read once: an Enum member's .value costs a descriptor call per job


@dataclass
class QueueCycle:
    """One job queue in one cycle: what the policy saw and what it decided."""

    queue: Queue
    hosts: list[HostDevices]
    running: list[Job] = field(default_factory=list)
    pending: dict[str, Job] = field(default_factory=dict)
    """The waiting jobs by id (the policy gets them as the queue's :class:`Backlog`)."""
    said: dict[str, tuple[str | None, int | None]] = field(default_factory=dict)
    """Waiting job id -> (pending reason, position) as its row says now."""
    state: State | None = None
    """What the policy decided on."""
    decision: Decision | None = None


@dataclass
class Plan:
    """What the scheduler decided in one cycle, for the actor (:mod:`.act`) to carry out."""

    queues: list[QueueCycle] = field(default_factory=list)
    """The job queues this cycle decides for, in quota-file order, each with its decision."""
    unknown: list[int] = field(default_factory=list)
    """Waiting jobs whose quota no job queue has: they can never run."""


class Scheduler:
    """Builds each job queue's policy state from the tables and the launcher's hosts and asks the
    policy what to do. Keeps between cycles what is costly to rebuild: the policy's jobs and the
    queues' backlogs."""

    def __init__(self, launcher: Launcher, checkpoints: CheckpointTimes) -> None:
        self.launcher = launcher
        self.checkpoints = checkpoints
        self._policy_jobs: dict[tuple, Job] = {}
        """(job row, preemptions, last checkpoint) -> the policy's job, from the last cycle."""
        self._backlogs: dict[str, Backlog] = {}
        """Job queue -> its waiting jobs in queue order, kept between cycles."""
        self.states: dict[str, State] = {}
        """Job queue -> the state of the last cycle that decided it (for the metrics and forecasts)."""
        self._told: set[tuple[str, str, str | None, tuple[str, ...]]] = set()
        """(job queue, host, its GPU type, the queue's types) already logged as a host of none of them."""

    def plan(self, cycle: Cycle) -> Plan:
        """Decide for every job queue with jobs.

        The jobs are read as plain rows (ten thousand waiting jobs are cheap to read, not to build
        as ORM objects); the actor loads the few it changes.
        """
        jobs = active_job_rows(session=cycle.session)
        if not jobs:
            self.states, self._backlogs = {}, {}
            return Plan()
        plan = self._queue_states(jobs, cycle)
        self.states = {}
        # Kept for queues the other scheduler decided this heartbeat: brought up to date when ours again.
        kept = {name: b for name, b in self._backlogs.items() if name not in cycle.locked}
        self._backlogs = kept | {c.queue.name: _backlog(self._backlogs.get(c.queue.name), c.pending) for c in plan.queues}
        for queue in plan.queues:
            state = queue.state = self.states[queue.queue.name] = self._policy_state(queue, self._backlogs[queue.queue.name])
            queue.decision = decide(state, cycle.now)
        return plan

    def _queue_states(self, jobs: Sequence[ActiveJob], cycle: Cycle) -> Plan:
        """Group the jobs by job queue as the policy sees them; jobs of unknown quotas go apart."""
        session = cycle.session
        counts = _preemption_counts(session)
        hosts = self.launcher.hosts(cycle.quota_file, session=session)
        cycles: dict[str, QueueCycle] = {}
        unknown: list[int] = []
        queue_of = {q.name: queue for queue in cycle.quota_file.queues for q in queue.quotas}
        known, seen = self._policy_jobs, {}
        holding: set[int] = set()
        moved: dict[str, list[int]] = {}
        placed = self.launcher.places_on_hosts
        for job in jobs:
            if job.state == _PENDING and (not job.queued or waits_for_backoff(job.gang, cycle.now)):
                continue  # revoked, not yet queued again, or a gang backing off: keeps its place, invisible until then
            queue = queue_of.get(job.quota)
            if queue is None:
                if job.state == _PENDING and UNQUEUED in cycle.locked:
                    unknown.append(job.id)
                continue
            if queue.name not in cycle.locked:
                continue  # the other scheduler decides for this queue this heartbeat
            if job.queue_name != queue.name:
                moved.setdefault(queue.name, []).append(job.id)
            queue_cycle = cycles.get(queue.name)
            if queue_cycle is None:
                queue_cycle = cycles[queue.name] = QueueCycle(queue, [h for h in hosts if h.queue == queue.name])
            checkpoint = None
            if job.state != _PENDING:
                ti = (job.dag_id, job.run_id, job.task_id, job.map_index)
                checkpoint = self.checkpoints.last_at(job.id, ti, job.started_at)
                holding.add(job.id)
            # The same columns, count and checkpoint give the same policy job: most cycles rebuild none.
            key = (job[:_DECIDED_ON], counts.get(job.id, 0), checkpoint)
            pj = known.get(key) or policy_job(job, key[1], placed=placed, last_checkpoint_at=checkpoint)
            seen[key] = pj
            if job.state == _PENDING:
                queue_cycle.pending[pj.id] = pj
                queue_cycle.said[pj.id] = (job.pending_reason, job.pending_position)
            else:
                queue_cycle.running.append(pj)
        self._policy_jobs = seen
        self.checkpoints.forget_all_but(holding)
        for name, ids in moved.items():  # new jobs, or a quota moved to another queue by an edit
            session.execute(
                update(QuotaJob).where(QuotaJob.id.in_(ids)).values(queue_name=name).execution_options(synchronize_session=False)
            )
        return Plan([cycles[q.name] for q in cycle.quota_file.queues if q.name in cycles], unknown)

    def _policy_state(self, queue: QueueCycle, backlog: Backlog) -> State:
        """The queue as the policy sees it; on a fleet with its hosts, a lost one down (it still
        counts for the rule on a job larger than every host, so that waits instead of failing). In a
        job queue with GPU types each host counts for its own type, and a type none has registered
        yet is one host down, as an untyped queue without hosts is."""
        if not self.launcher.places_on_hosts:
            return State.for_queue(queue.queue, queue.running, backlog)
        types = queue.queue.types
        if types:
            self._tell_hosts_of_no_type(queue)
        hosts = {
            h.name: Host(h.name, len(h.devices), down=not h.up, type=h.gpu_type if types else None) for h in queue.hosts
        }
        unknown: dict[str, tuple[int, str | None]] = {}  # a job on a host no longer registered: down, as large as its jobs
        for job in queue.running:
            for host in job.placed_on:
                if host not in hosts:
                    gpus = unknown.get(host, (0, None))[0]
                    unknown[host] = (gpus + job.gpus_per_node, job.gpu_type if types else None)
        hosts.update((name, Host(name, gpus, down=True, type=t)) for name, (gpus, t) in unknown.items())
        registered = {h.type for h in hosts.values()}
        for gpu_type in types:  # none registered yet (the scheduler started first): its jobs wait for them
            if gpu_type.name not in registered:
                name = f"(no {gpu_type.name} GPU host registered yet)"
                hosts[name] = Host(name, gpu_type.capacity, down=True, type=gpu_type.name)
        if not hosts:
            hosts[NO_HOST] = Host(NO_HOST, queue.queue.capacity, down=True)
        return State.for_queue(queue.queue, queue.running, backlog, hosts=sorted(hosts.values(), key=lambda h: h.name))

    def _tell_hosts_of_no_type(self, queue: QueueCycle) -> None:
        """Log, once per host and type, a host serving a typed job queue with none of its types (its
        worker started before the file had types, or with a type the file has since dropped): its GPUs
        count for no type and no job starts there (:mod:`~airflow_quota_provider.policy.types`)."""
        names = tuple(t.name for t in queue.queue.types)
        for host in queue.hosts:
            key = (queue.queue.name, host.name, host.gpu_type, names)
            if host.gpu_type in names or key in self._told:
                continue
            self._told.add(key)
            log.warning(
                "Host %s has GPU type %s; job queue %s lists %s: its GPUs count for none of them and no job starts "
                "there until its worker starts again with --gpu-type (one of them)",
                host.name, host.gpu_type, queue.queue.name, ", ".join(names),
            )


def _backlog(backlog: Backlog | None, pending: dict[str, Job]) -> Backlog:
    """The queue's backlog brought up to date with this cycle's waiting jobs: kept between cycles
    (as the simulator keeps its own), so that ten thousand waiting jobs are not sorted again every
    cycle. A job whose row changed has a new policy job and is replaced."""
    if backlog is not None:
        gone = [job.id for job in backlog if pending.get(job.id) is not job]
        new = len(pending) - (len(backlog) - len(gone))
        if (len(gone) + new) * 4 < len(pending):  # else sorting once beats inserting one by one
            for job_id in gone:
                backlog.remove(job_id)
            for job_id, job in pending.items():
                if job_id not in backlog:
                    backlog.add(job)
            return backlog
    return Backlog(pending.values())


def _preemption_counts(session: Session) -> dict[int, int]:
    """Job id -> preemption count of its task instance, for the active jobs (a join: a list of ten
    thousand keys in an IN clause is too deep for PostgreSQL)."""
    count = QuotaPreemptionCount
    rows = session.execute(
        select(QuotaJob.id, count.count)
        .join(
            QuotaJob,
            and_(
                QuotaJob.dag_id == count.dag_id,
                QuotaJob.run_id == count.run_id,
                QuotaJob.task_id == count.task_id,
                QuotaJob.map_index == count.map_index,
            ),
        )
        .where(QuotaJob.state.in_([JobState.PENDING.value, JobState.RUNNING.value, JobState.STOPPING.value]))
    )
    return {job_id: n for job_id, n in rows}
