"""The actor: carries out the scheduler's decisions: fails rejected tasks, tells victims to stop,
gives admitted jobs their devices on a host, and launches them once that is committed."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sqlalchemy import Integer, Text, column, update, values

from airflow.executors import workloads
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.gangs import forget_command, node_env, placement
from airflow_quota_provider.executors.launcher import Launch
from airflow_quota_provider.executors.task_instances import fail_ti, ti_state
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.gang import GangState
from airflow_quota_provider.models.job import (
    EventKind, JobState, QuotaJob, allocated_devices, devices_by_job, preemption_count, record_event,
)
from airflow_quota_provider.policy.preemption_policy import grace_period_of
from airflow_quota_provider.policy.types import running_by_type
from airflow_quota_provider.protocol import EXECUTOR_CONFIG_KEY, PreemptionNotice, TaskEnvironment

if TYPE_CHECKING:
    import logging
    from collections.abc import Callable

    from sqlalchemy.orm import Session

    from airflow_quota_provider.executors.config import QuotaConfig
    from airflow_quota_provider.executors.cycle import Cycle
    from airflow_quota_provider.executors.gangs import Gangs
    from airflow_quota_provider.executors.launcher import HostDevices, Launcher
    from airflow_quota_provider.executors.schedule import Plan, QueueCycle
    from airflow_quota_provider.policy import Decision, Preemption


class Actor:
    """Carries out the scheduler's plan: fails the jobs that can never run, tells victims to stop,
    gives admitted jobs their devices on a host, writes the waiting jobs' reasons, and launches the
    admitted jobs once that is committed."""

    def __init__(
        self, launcher: Launcher, gangs: Gangs, config: QuotaConfig, log: logging.Logger, *, token: Callable[[str], str]
    ) -> None:
        """``token``: a fresh workload token for a task instance id (a job may launch long after
        Airflow queued it)."""
        self.launcher = launcher
        self.gangs = gangs
        self.config = config
        self.log = log
        self.token = token

    def act(self, cycle: Cycle, plan: Plan) -> None:
        """Carry out the plan; the rows say what was done. Commits before launching, so the
        cycle's locks go with the admissions."""
        session = cycle.session
        names = [q.name for queue in cycle.quota_file.queues for q in queue.quotas]
        for job_id in plan.unknown:
            job = session.get(QuotaJob, job_id)
            reject(job, self._unknown_quota_message(job, names), cycle)
        admitted: list[QuotaJob] = []
        for queue in plan.queues:
            admitted += self._act(queue, cycle)
        if admitted:
            session.commit()  # devices are recorded before any process exists
            self._launch(admitted, cycle)

    def _act(self, queue: QueueCycle, cycle: Cycle) -> list[QuotaJob]:
        """Apply one job queue's decision (ORM objects are loaded only for the jobs that change
        state); the jobs given devices, to launch."""
        decision, session = queue.decision, cycle.session
        for rejection in decision.reject:
            job = _load(session, rejection.id)
            if job.state == JobState.PENDING.value:  # else revoked and dropped since this cycle read it
                reject(job, rejection.reason, cycle)
        for preemption in decision.preempt:
            job = _load(session, preemption.id)
            if job.state == JobState.RUNNING.value:
                self._preempt(job, preemption, queue, cycle)
        in_use: dict[tuple[str | None, str], int] = {}  # (GPU type, quota) -> GPUs, as the policy counted them
        for gpu_type, jobs in (running_by_type(queue.state) if queue.queue.types else {None: queue.running}).items():
            for job in jobs:
                in_use[gpu_type, job.quota] = in_use.get((gpu_type, job.quota), 0) + job.gpus
        held = set(allocated_devices(session=session)) if decision.admit else set()
        admitted = []
        for job_id in decision.admit:
            job = _load(session, job_id)
            hosts = _hosts_for(queue, decision, job_id, job.nodes)
            if self._admit(job, queue, hosts, decision.types.get(job_id), held, in_use, cycle):
                admitted.append(job)
        # Only what differs from what the row says (whichever scheduler wrote it last).
        said, reasons = queue.said, []
        for p in decision.pending:
            if said.get(p.id) != (p.reason, p.position):
                reasons.append({"id": int(p.id), "pending_reason": p.reason, "pending_position": p.position})
        if reasons:
            _write_reasons(reasons, session)
        return admitted

    def _preempt(self, job: QuotaJob, preemption: Preemption, queue: QueueCycle, cycle: Cycle) -> None:
        """Tell a running job to stop: deliver its notice; the deadline is its grace period."""
        grace = grace_period_of(job, queue.queue.quota(job.quota))
        deadline = cycle.now + float(grace)
        transitions.begin_stop(
            job, preemptor=preemption.for_, reason=preemption.reason, deadline=deadline,
            fail_message=preemption.message if preemption.fail else None, session=cycle.session,
        )
        notice = PreemptionNotice(preemption.reason, preemption.for_, deadline, preemption.fail, preemption.message)
        if job.handle:
            try:
                self.launcher.notify(job.handle, notice.to_dict(), session=cycle.session)
            except Exception:  # the deadline still stops it through Airflow
                self.log.exception("Could not deliver the preemption notice to %s on %s", job.ti_label(), job.host)
        self.gangs.notify(job, notice.to_dict(), cycle.session)
        self.log.info(
            "Preempting %s on %s for job %s (%s), grace %.0fs", job.ti_label(), job.host, preemption.for_, preemption.reason, grace
        )

    def _admit(
        self,
        job: QuotaJob,
        queue: QueueCycle,
        hosts: list[HostDevices] | None,
        gpu_type: str | None,
        held: set[tuple[str, str]],
        in_use: dict[tuple[str | None, str], int],
        cycle: Cycle,
    ) -> bool:
        """Give an admitted job its devices (lowest free indexes on its host; a gang's on each of its
        nodes' hosts) of the GPU type the policy chose (a typed job queue's) and mark it running;
        whether it got them."""
        session = cycle.session
        if job.state != JobState.PENDING.value or not job.workload:
            return False  # revoked since this cycle read it
        state = ti_state(job, session)
        if state != TaskInstanceState.QUEUED:  # cleared or marked by a person while it waited
            transitions.drop(job, f"dropped: its task instance is {state or 'none'}, no longer queued", now=cycle.now, session=session)
            return False
        free = {h.name: [d for d in h.devices if (h.name, d) not in held] for h in hosts or ()}
        nodes = placement(job, [h.name for h in hosts], free) if hosts else None
        if nodes is None:
            where = ", ".join(sorted({h.name for h in hosts})) if hosts else None
            self.log.warning("Job %s admitted but too few devices are free on %s; retrying", job.job_id, where)
            return False
        gang = None
        if job.nodes > 1:
            gang = GangState.of(job)
            gang.nodes = nodes
            forget_command(job, session)
        host, devices = nodes[0].host, nodes[0].devices
        held.update((node.host, d) for node in nodes for d in node.devices)
        by = f"by scheduler job {cycle.scheduler_job}" if cycle.scheduler_job is not None else None
        transitions.admit(job, host=host, devices=devices, now=cycle.now, by=by, gang=gang, gpu_type=gpu_type, session=session)
        key = (gpu_type, job.quota)
        in_use[key] = in_use.get(key, 0) + job.gpus
        of_type = next((t for t in queue.queue.types if t.name == gpu_type), queue.queue)  # a typed quota's is per type
        capacity = of_type.quota(job.quota).capacity
        if in_use[key] > capacity:
            gpus = f"{gpu_type} GPUs" if gpu_type else "GPUs"
            record_event(
                EventKind.BORROWED, job=job, session=session, host=host, devices=",".join(devices),
                message=f"quota {job.quota} uses {in_use[key]} of its {capacity} {gpus}",
            )
        return True

    def _launch(self, jobs: list[QuotaJob], cycle: Cycle) -> None:
        """Start the admitted jobs' tasks, each with a fresh token and exactly its devices visible,
        all of them together (:meth:`Launcher.launch_all`)."""
        session = cycle.session
        devices = devices_by_job([job.id for job in jobs], session=session)
        ready: list[tuple[QuotaJob, Launch]] = []
        for job in jobs:
            try:
                ready.append((job, self._prepare(job, devices.get(job.id, []), cycle)))
            except Exception as e:
                self._launch_failed(job, e, session)
        try:
            results = self.launcher.launch_all([launch for _, launch in ready], session=session)
        except Exception as e:  # none of them is known to have started: the next cycle starts them again
            results = [e] * len(ready)
        for (job, _), result in zip(ready, results):
            if isinstance(result, Exception):
                self._launch_failed(job, result, session)
            else:
                transitions.launched(job, result)
        session.flush()

    def _prepare(self, job: QuotaJob, devices: list[str], cycle: Cycle) -> Launch:
        workload = workloads.ExecuteTask.model_validate_json(job.workload or "")
        workload.token = self.token(str(workload.ti.id))
        gang = GangState.of(job) if job.nodes > 1 else None
        env = task_env(job, job.host, gang.nodes[0].devices if gang else devices, cycle)
        if gang:  # MASTER_PORT comes from node 0's host
            env.update(node_env(job, 0, self.launcher.address(job.host, session=cycle.session), None))
        return Launch(job.id, job.host, workload, env)

    def _launch_failed(self, job: QuotaJob, error: Exception, session: Session) -> None:
        self.log.error("Could not launch %s on %s", job.ti_label(), job.host, exc_info=error)
        transitions.launch_failed(job, str(error), session=session)

    def _unknown_quota_message(self, job: QuotaJob, names: list[str]) -> str:
        if not job.quota:
            return (
                f"task {job.ti_label()} has no quota: set pool=<quota> (one of {', '.join(names)}) "
                f'or executor_config={{"{EXECUTOR_CONFIG_KEY}": {{"quota": <quota>}}}}'
            )
        return f"quota: {job.quota!r} is not one of {', '.join(names)} (quota file {self.config.path})"


def reject(job: QuotaJob, reason: str, cycle: Cycle) -> None:
    """A job that can never run: fail its task with the reason, keep serving everyone else."""
    fail_ti(job, f"QuotaExecutor: {reason}", cycle.session, from_states=[TaskInstanceState.QUEUED])
    transitions.reject(job, reason, now=cycle.now, session=cycle.session)


def task_env(job: QuotaJob, host: str, devices: list[str], cycle: Cycle) -> dict[str, str]:
    """What a job (a gang's node) on ``host`` is told beside the gang's variables: its devices, job,
    host, quota, preemption count, grace period and GPU type (``QUOTA_*``)."""
    return TaskEnvironment(
        cuda_visible_devices=",".join(devices),
        job_id=job.job_id,
        host=host,
        quota=job.quota,
        preemption_count=preemption_count(job.dag_id, job.run_id, job.task_id, job.map_index, session=cycle.session),
        grace_period_s=grace_period_of(job, cycle.quota_file.quota(job.quota)),
        gpu_type=job.gpu_type,
    ).to_env()


def _hosts_for(queue: QueueCycle, decision: Decision, job_id: str, nodes: int) -> list[HostDevices] | None:
    """The host of each node that the policy chose (one node but a gang's), or the queue's only host
    for every node when the launcher has one per queue; None when one is not up."""
    chosen = decision.hosts.get(job_id)
    up = {host.name: host for host in queue.hosts if host.up}
    if chosen is None:
        return [next(iter(up.values()))] * nodes if up else None
    names = [chosen] if isinstance(chosen, str) else list(chosen)
    return [up[name] for name in names] if all(name in up for name in names) else None


def _load(session: Session, job_id: str) -> QuotaJob:
    """A job the decision changes, as it is now and locked until the cycle commits (a revoke by the
    scheduler that queued it does not wait for the job queue's lock)."""
    return session.get(QuotaJob, int(job_id), with_for_update=True, populate_existing=True)


def _write_reasons(rows: list[dict], session: Session) -> None:
    """Pending reasons and positions by job id. When one job of a quota starts, every job behind it
    moves up a place: on PostgreSQL that is one UPDATE ... FROM (VALUES ...) per thousand jobs, not a
    statement per job."""
    if session.get_bind().dialect.name != "postgresql":
        session.execute(update(QuotaJob), rows)  # an executemany by primary key
        return
    for start in range(0, len(rows), 1000):
        chunk = rows[start : start + 1000]
        given = values(
            column("id", Integer), column("reason", Text), column("position", Integer), name="given"
        ).data([(r["id"], r["pending_reason"], r["pending_position"]) for r in chunk])
        session.execute(
            update(QuotaJob)
            .where(QuotaJob.id == given.c.id)
            .values(pending_reason=given.c.reason, pending_position=given.c.position)
            .execution_options(synchronize_session=False)
        )
