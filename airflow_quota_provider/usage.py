"""Read side of the quota tables: per-quota usage as the REST API, the UI page and the metrics show it.

The figures come from :func:`airflow_quota_provider.policy.summarize` over the same state the
executor decides on (running and stopping jobs hold GPUs; pending jobs that Airflow has queued wait),
so what people see is what the next scheduling cycle works with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Generic, TypeVar

from airflow_quota_provider.models.gang import GangState, gang_hosts
from airflow_quota_provider.models.job import (
    JobState,
    QuotaJob,
    active_job_rows,
    allocated_devices,
    device_sort_key,
    list_jobs,
    policy_job,
)
from airflow_quota_provider.policy import CohortUsage, QuotaUsage, State, summarize, summarize_cohorts
from airflow_quota_provider.policy.types import running_by_type

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from sqlalchemy.orm import Session

    from airflow_quota_provider.models.job import ActiveJob
    from airflow_quota_provider.policy import Cohort, Queue, Quota, QuotaFile


U = TypeVar("U", QuotaUsage, CohortUsage)


@dataclass(frozen=True)
class TypeUsage(Generic[U]):
    """A quota's or cohort's figures on one GPU type of a typed job queue (:mod:`.policy.types`)."""

    gpu_type: str
    usage: U
    """:func:`~airflow_quota_provider.policy.summarize` (or ``summarize_cohorts``) over that type alone
    (:func:`type_states`): its capacities, and the GPUs of the running jobs that count on that type. A
    waiting job has no type until it is admitted, so a quota's ``pending_jobs`` and ``pending_gpus``
    are 0 here (its row counts them)."""


@dataclass(frozen=True)
class QuotaRow:
    """One quota's rule and its figures right now."""

    queue: Queue
    quota: Quota
    usage: QuotaUsage
    """Over all its GPUs: a typed queue's quota has its capacity and limits summed over the types."""
    types: tuple[TypeUsage[QuotaUsage], ...] = ()
    """A typed job queue's quota: its figures per GPU type, in the queue's order; empty: untyped."""


def quota_rows(quota_file: QuotaFile, *, session: Session, states: Mapping[str, State] | None = None) -> list[QuotaRow]:
    """Every quota of every job queue, in file order, with :func:`~airflow_quota_provider.policy.summarize`'s
    figures computed from the job table, or from ``states`` (job queue -> the state a scheduling
    cycle just decided on; a queue without one has no active job); a typed queue's also per type."""
    if states is None:
        states = _queue_states(quota_file, active_job_rows(session=session))
    rows = []
    for queue in quota_file.queues:
        state = states.get(queue.name) or State.for_queue(queue, (), ())
        usage = summarize(state)
        per_type = {name: summarize(sub) for name, sub in type_states(state).items()}
        rows.extend(
            QuotaRow(queue, quota, usage[quota.name],
                     tuple(TypeUsage(name, figures[quota.name]) for name, figures in per_type.items()))
            for quota in queue.quotas
        )
    return rows


def type_states(state: State) -> dict[str, State]:
    """A typed job queue's state as one untyped state per GPU type, in the queue's order (empty for an
    untyped queue): the type's capacities, and the running jobs that count on that type
    (:func:`~airflow_quota_provider.policy.types.running_by_type`), as the policy decides each type.
    Waiting jobs are left out: a job's type is chosen when it is admitted."""
    if not state.types:
        return {}
    running = running_by_type(state)
    return {
        t.name: State(capacity=t.capacity, quotas=t.quotas, running=tuple(running[t.name]), pending=(),
                      cohorts=t.cohorts)
        for t in state.types
    }


def idle(usage: QuotaUsage) -> int:
    """GPUs of a quota's capacity that nobody uses: neither its own jobs within it nor borrowers."""
    return max(0, usage.capacity - (usage.in_use - usage.borrowed) - usage.lent)


def bar_figures(usage: QuotaUsage) -> dict[str, int]:
    """A quota's bar (of all its GPUs, or of one type's): its capacity split into owned, lent and idle,
    what it borrows above it, and what a new job could start now."""
    return {"capacity": usage.capacity, "owned": usage.in_use - usage.borrowed, "borrowed": usage.borrowed,
            "lent": usage.lent, "idle": idle(usage), "free": usage.free}


def cohort_figures(usage: CohortUsage) -> dict[str, int]:
    """A cohort's subtree's figures (of all its GPUs, or of one type's)."""
    return {"capacity": usage.capacity, "in_use": usage.in_use, "borrowed": usage.borrowed, "lent": usage.lent}


@dataclass(frozen=True)
class CohortRow:
    """One cohort's rule and its subtree's figures right now."""

    queue: Queue
    cohort: Cohort
    usage: CohortUsage
    types: tuple[TypeUsage[CohortUsage], ...] = ()
    """A typed job queue's cohort: its subtree's figures per GPU type, in the queue's order; empty: untyped."""


def cohort_rows(quota_file: QuotaFile, *, session: Session, states: Mapping[str, State] | None = None) -> list[CohortRow]:
    """Every cohort of every job queue, in file order, with
    :func:`~airflow_quota_provider.policy.summarize_cohorts`'s figures (none for a flat file, which
    reads no table); a typed queue's also per type."""
    if not any(queue.cohorts for queue in quota_file.queues):
        return []
    if states is None:
        states = _queue_states(quota_file, active_job_rows(session=session))
    rows = []
    for queue in quota_file.queues:
        state = states.get(queue.name) or State.for_queue(queue, (), ())
        usage = summarize_cohorts(state)
        per_type = {name: summarize_cohorts(sub) for name, sub in type_states(state).items()}
        rows.extend(
            CohortRow(queue, cohort, usage[cohort.name],
                      tuple(TypeUsage(name, figures[cohort.name]) for name, figures in per_type.items()))
            for cohort in queue.cohorts
        )
    return rows


def _queue_states(quota_file: QuotaFile, jobs: Sequence[ActiveJob]) -> dict[str, State]:
    queue_of = {q.name: queue for queue in quota_file.queues for q in queue.quotas}
    running: dict[str, list] = {queue.name: [] for queue in quota_file.queues}
    pending: dict[str, list] = {queue.name: [] for queue in quota_file.queues}
    for job in jobs:
        queue = queue_of.get(job.quota)
        if queue is None:
            continue
        if job.state != JobState.PENDING.value:
            running[queue.name].append(policy_job(job, 0))
        elif job.queued:
            pending[queue.name].append(policy_job(job, 0))
    return {q.name: State.for_queue(q, running[q.name], pending[q.name]) for q in quota_file.queues}


@dataclass(frozen=True)
class QueueHosts:
    """The registered GPU hosts of one job queue: GPUs in the pool now, and hosts lost."""

    gpus_up: int
    lost: tuple[str, ...]
    gpus_up_by_type: dict[str, int]
    """Of ``gpus_up``, those of each GPU type (hosts that say their type)."""


def queue_hosts(*, session: Session) -> dict[str, QueueHosts]:
    """Per job queue, from the fleet's host table (empty without registered hosts: local launcher)."""
    from airflow_quota_provider.models.host import HostState, list_hosts

    up: dict[str, int] = {}
    by_type: dict[str, dict[str, int]] = {}
    lost: dict[str, list[str]] = {}
    for host in list_hosts(session=session):
        for queue in host.queue_list:
            if host.state == HostState.ACTIVE.value:
                up[queue] = up.get(queue, 0) + len(host.device_list)
                if host.gpu_type:
                    of_type = by_type.setdefault(queue, {})
                    of_type[host.gpu_type] = of_type.get(host.gpu_type, 0) + len(host.device_list)
            else:
                up.setdefault(queue, 0)
                lost.setdefault(queue, []).append(host.name)
    return {queue: QueueHosts(gpus, tuple(lost.get(queue, ())), by_type.get(queue, {})) for queue, gpus in up.items()}


@dataclass(frozen=True)
class NodeDevices:
    """One node of a job: its host and the GPUs it holds there."""

    host: str
    devices: list[str]


def held_devices(*, session: Session) -> dict[int, dict[str, list[str]]]:
    """Per job id: host -> the devices it holds there, in device order (one query for every job)."""
    out: dict[int, dict[str, list[str]]] = {}
    for (host, device), job_id in allocated_devices(session=session).items():
        out.setdefault(job_id, {}).setdefault(host, []).append(device)
    for hosts in out.values():
        for devices in hosts.values():
            devices.sort(key=device_sort_key)
    return out


def job_hosts(job: QuotaJob) -> list[str]:
    """The hosts a job holds devices on, node 0's first (``QuotaJob.to_dict``'s ``hosts``)."""
    if job.nodes > 1:
        return list(gang_hosts(job.gang))
    return [job.host] if job.host else []


def job_nodes(job: QuotaJob, held: Mapping[str, Sequence[str]]) -> list[NodeDevices]:
    """Where a job holds devices, one entry per node, node 0 first; ``held``: its host -> devices
    (:func:`held_devices`). Empty when it holds none."""
    if not held:
        return []
    return [NodeDevices(host, list(held.get(host, ()))) for host in job_hosts(job)]


def pending_reason(job: QuotaJob, now: float) -> str | None:
    """Why a pending job waits, as people read it. A gang backing off after a failed start is not
    seen by the policy until then, so its stored reason (its eviction) is prefixed with when."""
    if job.state != JobState.PENDING.value:
        return None
    gang = GangState.parse(job.gang) if job.nodes > 1 else None
    if gang is None or gang.not_before is None or now >= gang.not_before:
        return job.pending_reason
    starts = f"{gang.start_failures} failed start{'' if gang.start_failures == 1 else 's'}"
    backoff = f"gang backing off after {starts}: considered again in {gang.not_before - now:.0f} s"
    return f"{backoff}; {job.pending_reason}" if job.pending_reason else backoff


def _waiting(job: QuotaJob) -> bool:
    """A pending job that Airflow has queued (a revoked one keeps its place but is not waiting now)."""
    return job.state == JobState.PENDING.value and bool(job.workload)


def pending_jobs(*, session: Session) -> Sequence[QuotaJob]:
    """Waiting jobs by quota and position (the order of each quota's queue)."""
    jobs = [j for j in list_jobs(states=[JobState.PENDING], session=session) if _waiting(j)]
    return sorted(jobs, key=lambda j: (j.quota, j.pending_position or 1 << 30, j.submitted_at, j.id))
