"""Jobs, device allocations, audit events and preemption counts, with one function per state change.

A *job* is one try of one Airflow task instance placed on a quota. The executor rebuilds all its
in-memory state from these rows on every heartbeat, so a restarted scheduler loses nothing.
Times are POSIX seconds (floats), the unit the policy core works in.
"""

from __future__ import annotations

import json
import time
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from sqlalchemy import (
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from airflow_quota_provider.models.base import QuotaBase
from airflow_quota_provider.models.coordination import db_now
from airflow_quota_provider.models.gang import gang_hosts
from airflow_quota_provider.policy import Job, PolicyError
from airflow_quota_provider.policy.config import queue_to_dict

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from airflow_quota_provider.policy import QuotaFile

    from sqlalchemy.orm import Session


class JobState(str, Enum):
    """Where a job is in its life; the values are stored in ``quota_job.state``."""

    PENDING = "pending"
    """Waiting for quota. ``pending_reason`` and ``pending_position`` say why and where."""
    RUNNING = "running"
    """Launched on its devices of ``host``; ``handle`` is the launcher's name for its process."""
    STOPPING = "stopping"
    """Told to stop (preempt file written); still holds its devices until its process is gone."""
    PREEMPTED = "preempted"
    """Stopped by preemption; waits for Airflow to queue it again, then becomes ``pending`` at its
    original position (``submitted_at`` is kept)."""
    FINISHED = "finished"
    """Its process ended and the executor reported it to Airflow."""
    FAILED = "failed"
    """Rejected by the policy (unknown quota, too many GPUs), past its preemption limit, or a gang past
    its start limit; its task instance was failed with ``message``."""

    @classmethod
    def active(cls) -> tuple[JobState, ...]:
        return (cls.PENDING, cls.RUNNING, cls.STOPPING, cls.PREEMPTED)

    @classmethod
    def holding(cls) -> tuple[JobState, ...]:
        """The states in which a job holds devices."""
        return (cls.RUNNING, cls.STOPPING)


class Report(str, Enum):
    """``quota_job.report``: how a job that left the executor's hands ends for Airflow."""

    SUCCESS = "success"
    """The task process ended on its own: the task instance says how."""
    FAILED = "failed"
    """The task process was killed without saying how: the task fails."""
    RELEASED = "released"
    """Nothing to report (the task instance was already set, or it waits to be queued again): the
    executor only stops counting it as running."""


UNDECIDED = "waiting for the next scheduling cycle"
"""The pending reason of a job no scheduling cycle has decided on yet."""


class EventKind(str, Enum):
    """Kinds of audit event in ``quota_event``."""

    SUBMITTED = "submitted"
    """The executor received the task (first time, or again after a preemption)."""
    ADMITTED = "admitted"
    """The job started; ``devices`` lists the GPU indexes it holds."""
    BORROWED = "borrowed"
    """The job was admitted on capacity lent by other quotas."""
    PREEMPTED = "preempted"
    """A running job was told to stop: ``victim``, ``preemptor``, ``reason``."""
    RECLAIMED = "reclaimed"
    """A preemption whose reason is reclaim: the preemptor's quota takes back lent capacity."""
    FORCED = "forced"
    """A victim still running at the end of its grace period was set to up_for_reschedule (or
    failed, past its limit) so that Airflow's supervisor ends it."""
    STOPPED = "stopped"
    """A preempted job's process is gone; it goes back to its queue."""
    RELEASED = "released"
    """A job's devices were freed (its process is gone); ``devices`` lists them."""
    FINISHED = "finished"
    """The job's process ended on its own."""
    PRIORITY_CHANGED = "priority_changed"
    """Priority changed by a person (CLI, REST, UI); ``message`` says from what to what."""
    PREEMPTION_LIMIT_REACHED = "preemption_limit_reached"
    """A preemption past ``max_preemptions``: the task fails with ``message``."""
    REJECTED = "rejected"
    """The job can never run (unknown quota, more GPUs than its quota can get); the task fails."""
    REVOKED = "revoked"
    """Airflow revoked the queued task (``task_queued_timeout``); the job keeps its place."""
    ADOPTED = "adopted"
    """A restarted scheduler took the job over."""
    EVICTED = "evicted"
    """The job's host was lost: its devices left the pool and the job waits at its original place
    without using an Airflow retry (not counted as a preemption)."""
    HOST_JOINED = "host_joined"
    """A GPU host registered (``host``, ``devices``), or came back after it was lost."""
    HOST_LOST = "host_lost"
    """A GPU host stopped heartbeating for ``[quota] host_lost_after_s``; its devices leave the pool."""
    CONFIG_LOADED = "config_loaded"
    """The quota file was loaded (scheduler start) or reloaded; ``message`` is its path, ``detail``
    its job queues as JSON (:func:`record_config_loaded`), which usage accounting charges with."""
    CONFIG_REJECTED = "config_rejected"
    """An edited quota file was invalid; the last good configuration stays; ``message`` says why."""


class QuotaJob(QuotaBase):
    """One try of one task instance on a quota."""

    __tablename__ = "quota_job"
    __table_args__ = (
        UniqueConstraint("dag_id", "run_id", "task_id", "map_index", "try_number", name="quota_job_ti_uq"),
        Index("idx_quota_job_report", "report"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    dag_id: Mapped[str] = mapped_column(String(250), nullable=False)
    run_id: Mapped[str] = mapped_column(String(250), nullable=False)
    task_id: Mapped[str] = mapped_column(String(250), nullable=False)
    map_index: Mapped[int] = mapped_column(Integer, nullable=False, default=-1)
    try_number: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    ti_id: Mapped[str | None] = mapped_column(String(36))
    quota: Mapped[str] = mapped_column(String(128), nullable=False)
    queue_name: Mapped[str | None] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer, nullable=False, default=1)
    """GPUs in all (a gang's: per node times ``nodes``), what the job counts against its quota."""
    nodes: Mapped[int] = mapped_column(Integer, nullable=False, default=1, server_default="1")
    """Hosts the job spans; above 1 it is a gang (:mod:`..executors.gangs`)."""
    gpu_types: Mapped[str | None] = mapped_column(Text)
    """The GPU types the job accepts, in its order of preference, as a JSON list; None: any."""
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    """The GPU type the job runs on while it holds devices (a typed job queue's); None otherwise."""
    priority: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    preemptible: Mapped[bool] = mapped_column(Boolean, nullable=False, default=True)
    max_preemptions: Mapped[int | None] = mapped_column(Integer)
    grace_period_s: Mapped[float | None] = mapped_column(Float)
    expected_runtime_s: Mapped[float | None] = mapped_column(Float)
    """Seconds a run is expected to take, set when the task is queued (:mod:`..executors.runtimes`);
    None: unknown."""
    state: Mapped[str] = mapped_column(String(20), nullable=False, default=JobState.PENDING.value)
    submitted_at: Mapped[float] = mapped_column(Float, nullable=False)
    started_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    pending_reason: Mapped[str | None] = mapped_column(Text)
    pending_position: Mapped[int | None] = mapped_column(Integer)
    estimated_start_at: Mapped[float | None] = mapped_column(Float)
    """When a waiting job is expected to start (:mod:`..executors.estimates`); None: unknown, or not
    forecast yet. Refreshed every few cycles, so read it only while the job is pending."""
    host: Mapped[str | None] = mapped_column(String(255))
    """Where the job runs (or ran last): a GPU host's name; a gang's node 0's."""
    gang: Mapped[str | None] = mapped_column(Text)
    """A gang's nodes while it holds devices, and its start failures (:class:`..executors.gangs.GangState`
    as JSON); None for a job on one host."""
    handle: Mapped[str | None] = mapped_column(String(255))
    """The launcher's opaque name for the job's process while it holds devices."""
    preempted_for: Mapped[str | None] = mapped_column(String(64))
    preempt_reason: Mapped[str | None] = mapped_column(String(32))
    preempt_deadline: Mapped[float | None] = mapped_column(Float)
    preempt_fail_message: Mapped[str | None] = mapped_column(Text)
    forced_at: Mapped[float | None] = mapped_column(Float)
    workload: Mapped[str | None] = mapped_column(Text)
    """The Airflow ``ExecuteTask`` workload as JSON; cleared when Airflow revokes the task."""
    message: Mapped[str | None] = mapped_column(Text)
    report: Mapped[str | None] = mapped_column(String(20))
    """What the executor of the scheduler that queued the task must still tell Airflow about the
    job's end (:class:`Report`); any scheduler may settle a job, only that one reports it."""

    @property
    def job_id(self) -> str:
        """The id the policy, the preempt file and ``QUOTA_JOB_ID`` use."""
        return str(self.id)

    def ti_label(self) -> str:
        mi = f"[{self.map_index}]" if self.map_index >= 0 else ""
        return f"{self.dag_id}.{self.task_id}{mi} {self.run_id} try {self.try_number}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.job_id,
            "dag_id": self.dag_id,
            "run_id": self.run_id,
            "task_id": self.task_id,
            "map_index": self.map_index,
            "try_number": self.try_number,
            "quota": self.quota,
            "queue": self.queue_name,
            "gpus": self.gpus,
            "nodes": self.nodes,
            "gpu_types": gpu_types_of(self.gpu_types),
            "gpu_type": self.gpu_type,
            "host": self.host,
            "hosts": gang_hosts(self.gang) if self.nodes > 1 else ([self.host] if self.host else []),
            "priority": self.priority,
            "preemptible": self.preemptible,
            "max_preemptions": self.max_preemptions,
            "expected_runtime_s": self.expected_runtime_s,
            "state": self.state,
            "submitted_at": self.submitted_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "pending_reason": self.pending_reason,
            "pending_position": self.pending_position,
            "estimated_start_at": self.estimated_start_at if self.state == JobState.PENDING.value else None,
            "preempted_for": self.preempted_for,
            "message": self.message,
        }


class QuotaDeviceAllocation(QuotaBase):
    """A device held by a job. (host, device) is the primary key: no device is ever held twice."""

    __tablename__ = "quota_device_allocation"

    host: Mapped[str] = mapped_column(String(255), primary_key=True)
    device: Mapped[str] = mapped_column(String(64), primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("quota_job.id", ondelete="CASCADE"), nullable=False)
    allocated_at: Mapped[float] = mapped_column(Float, nullable=False)


class QuotaEvent(QuotaBase):
    """One line of the audit log."""

    __tablename__ = "quota_event"
    __table_args__ = (Index("idx_quota_event_at", "at"),)  # usage reports and db-clean select by time

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, nullable=False)
    kind: Mapped[str] = mapped_column(String(32), nullable=False)
    job_id: Mapped[int | None] = mapped_column(Integer)
    dag_id: Mapped[str | None] = mapped_column(String(250))
    run_id: Mapped[str | None] = mapped_column(String(250))
    task_id: Mapped[str | None] = mapped_column(String(250))
    map_index: Mapped[int | None] = mapped_column(Integer)
    quota: Mapped[str | None] = mapped_column(String(128))
    victim: Mapped[str | None] = mapped_column(String(64))
    preemptor: Mapped[str | None] = mapped_column(String(64))
    reason: Mapped[str | None] = mapped_column(String(64))
    host: Mapped[str | None] = mapped_column(String(255))
    devices: Mapped[str | None] = mapped_column(String(512))
    message: Mapped[str | None] = mapped_column(Text)
    checkpoint_at: Mapped[float | None] = mapped_column(Float)
    """On ``stopped``: when the preempted run last saved its work (its lost work starts there), where
    the scheduler could see its checkpoints; None: no checkpoint in that run, or none visible."""
    detail: Mapped[str | None] = mapped_column(Text)
    """On ``config_loaded``: the quota file's job queues as JSON, in the quota file's form."""
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    """The GPU type the job holds (or held) devices of, where it has one: usage is accounted per type."""

    def to_dict(self) -> dict[str, Any]:
        return {c.name: getattr(self, c.name) for c in self.__table__.columns}


class QuotaPreemptionCount(QuotaBase):
    """How often a task instance was preempted, across its tries (Airflow's TaskReschedule rows are
    deleted on real retries and are also written by sensors, so they cannot count this)."""

    __tablename__ = "quota_preemption_count"

    dag_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    run_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    map_index: Mapped[int] = mapped_column(Integer, primary_key=True, default=-1)
    count: Mapped[int] = mapped_column(Integer, nullable=False, default=0)
    last_at: Mapped[float | None] = mapped_column(Float)


_PENDING, _STOPPING = JobState.PENDING.value, JobState.STOPPING.value  # read once per import, not per job

class ActiveJob(NamedTuple):
    """What a scheduling cycle reads of a pending, running or stopping job (a plain tuple: ten
    thousand of them are cheap to read, hash and compare, unlike ORM objects or SQLAlchemy rows)."""

    id: int
    state: str
    quota: str
    queue_name: str | None
    gpus: int
    priority: int
    submitted_at: float
    started_at: float | None
    preemptible: bool
    max_preemptions: int | None
    preempted_for: str | None
    host: str | None
    nodes: int
    gang: str | None
    expected_runtime_s: float | None
    grace_period_s: float | None
    gpu_types: str | None
    gpu_type: str | None
    queued: bool
    """Whether Airflow has queued the job's task (a revoked or preempted one keeps its place without)."""
    pending_reason: str | None
    pending_position: int | None
    dag_id: str
    run_id: str
    task_id: str
    map_index: int


def active_job_rows(*, session: Session) -> list[ActiveJob]:
    """Pending, running and stopping jobs, in queue order."""
    # On the session's connection, not the session: plain columns need none of the ORM's loading,
    # which costs more than the query itself at ten thousand rows.
    columns = [
        QuotaJob.workload.is_not(None).label(name) if name == "queued" else getattr(QuotaJob, name)
        for name in ActiveJob._fields
    ]
    result = session.connection().execute(
        select(*columns)
        .where(QuotaJob.state.in_([JobState.PENDING.value, JobState.RUNNING.value, JobState.STOPPING.value]))
        .order_by(QuotaJob.submitted_at, QuotaJob.id)
    )
    return [ActiveJob._make(row) for row in result]


def policy_job(
    job: QuotaJob | ActiveJob, preemptions: int, *, placed: bool = False, last_checkpoint_at: float | None = None
) -> Job:
    """The policy's view of a job (an ORM object or a row with its columns): running and stopping
    jobs carry ``started_at`` and ``last_checkpoint_at`` (when it saved its work in this run, as the
    caller found it), and their ``host`` (a gang's: its nodes' ``hosts``) when the policy places jobs
    on hosts."""
    holding = job.state != _PENDING
    return Job(
        id=str(job.id),
        quota=job.quota,
        gpus=job.gpus,
        priority=job.priority,
        submitted_at=job.submitted_at,
        started_at=job.started_at if holding else None,
        preemptible=job.preemptible,
        max_preemptions=job.max_preemptions,
        preemptions=preemptions,
        last_checkpoint_at=last_checkpoint_at if holding else None,
        expected_runtime_s=job.expected_runtime_s,
        grace_period_s=job.grace_period_s,
        preempted_for=job.preempted_for if job.state == _STOPPING else None,
        host=job.host if placed and holding else None,
        nodes=job.nodes,
        hosts=gang_hosts(job.gang) if placed and holding and job.nodes > 1 else (),
        gpu_types=gpu_types_of(job.gpu_types),
        gpu_type=job.gpu_type if holding else None,
    )


def gpu_types_of(column: str | None) -> tuple[str, ...]:
    """``quota_job.gpu_types`` as the types in the job's order of preference (empty: any)."""
    return tuple(json.loads(column)) if column else ()


class JobNotFound(LookupError):
    """No active job for the task instance named."""


# --------------------------------------------------------------------------------------------------
# Queries


def find_job(
    dag_id: str, run_id: str, task_id: str, *, map_index: int = -1, session: Session, active_only: bool = False
) -> QuotaJob:
    """The latest job of a task instance; raises :class:`JobNotFound` naming it."""
    query = select(QuotaJob).where(
        QuotaJob.dag_id == dag_id,
        QuotaJob.run_id == run_id,
        QuotaJob.task_id == task_id,
        QuotaJob.map_index == map_index,
    )
    if active_only:
        query = query.where(QuotaJob.state.in_([s.value for s in JobState.active()]))
    job = session.scalars(query.order_by(QuotaJob.try_number.desc(), QuotaJob.id.desc()).limit(1)).first()
    if job is None:
        what = "active job" if active_only else "job"
        mi = f" map_index={map_index}" if map_index >= 0 else ""
        raise JobNotFound(f"no {what} for dag_id={dag_id} run_id={run_id} task_id={task_id}{mi}")
    return job


def list_jobs(*, states: Iterable[str] | None = None, session: Session) -> Sequence[QuotaJob]:
    """Jobs in the given states (default: the active ones), oldest submission first."""
    wanted = [str(getattr(s, "value", s)) for s in (states or JobState.active())]
    return session.scalars(
        select(QuotaJob).where(QuotaJob.state.in_(wanted)).order_by(QuotaJob.submitted_at, QuotaJob.id)
    ).all()


def devices_of(job_id: int, *, session: Session) -> list[str]:
    return devices_by_job([job_id], session=session).get(job_id, [])


def devices_by_job(job_ids: list[int], *, session: Session) -> dict[int, list[str]]:
    """:func:`devices_of` for many jobs in one query."""
    out: dict[int, list[str]] = {}
    if job_ids:
        for job_id, device in session.execute(
            select(QuotaDeviceAllocation.job_id, QuotaDeviceAllocation.device).where(QuotaDeviceAllocation.job_id.in_(job_ids))
        ):
            out.setdefault(job_id, []).append(device)
    return {job_id: sorted(devices, key=device_sort_key) for job_id, devices in out.items()}


def allocated_devices(*, session: Session) -> dict[tuple[str, str], int]:
    """(host, device) -> job id, for every held device."""
    return {(a.host, a.device): a.job_id for a in session.scalars(select(QuotaDeviceAllocation))}


def preemption_count(dag_id: str, run_id: str, task_id: str, map_index: int = -1, *, session: Session) -> int:
    row = session.get(QuotaPreemptionCount, (dag_id, run_id, task_id, map_index))
    return row.count if row else 0


def queued_again(job: QuotaJob, *, session: Session) -> bool:
    """Whether Airflow queued ``job``'s task again since its last admission (its audit log has a
    ``submitted`` event after its last ``admitted`` one): a running job's try was then over before its
    process's end was settled (:func:`~airflow_quota_provider.models.transitions.finish_queued_again`)."""
    last = {
        kind: at_id for kind, at_id in session.execute(
            select(QuotaEvent.kind, func.max(QuotaEvent.id))
            .where(QuotaEvent.job_id == job.id, QuotaEvent.kind.in_([EventKind.ADMITTED.value, EventKind.SUBMITTED.value]))
            .group_by(QuotaEvent.kind)
        )
    }
    admitted, submitted = last.get(EventKind.ADMITTED.value), last.get(EventKind.SUBMITTED.value)
    return admitted is not None and submitted is not None and submitted > admitted


def device_sort_key(device: str) -> tuple[int, str]:
    return (int(device), "") if device.isdigit() else (1 << 30, device)


# --------------------------------------------------------------------------------------------------
# State changes (shared by executor, CLI and REST)


def record_event(kind: EventKind, *, job: QuotaJob | None = None, session: Session, **fields: Any) -> QuotaEvent:
    """Append one audit event; ``fields`` are columns of :class:`QuotaEvent`. It is stamped by the
    database's clock, which every scheduler and host shares. A ``job``'s event carries its quota and,
    while it holds devices of one, its GPU type."""
    event = QuotaEvent(at=fields.pop("at", None) or db_now(session), kind=EventKind(kind).value, **fields)
    if job is not None:
        event.job_id = job.id
        event.dag_id, event.run_id, event.task_id = job.dag_id, job.run_id, job.task_id
        event.map_index = job.map_index
        event.quota = event.quota or job.quota
        event.gpu_type = event.gpu_type or job.gpu_type
    session.add(event)
    return event


def record_config_loaded(quota_file: QuotaFile, path: str, *, session: Session) -> QuotaEvent:
    """Record that ``quota_file`` (read from ``path``) is in force from now on: its job queues go in
    ``detail``, in the quota file's own form, so usage accounting charges each moment with the
    capacities then in force (:func:`~airflow_quota_provider.models.usage.config_history`)."""
    queues = [queue_to_dict(queue) for queue in quota_file.queues]
    return record_event(EventKind.CONFIG_LOADED, session=session, message=path, detail=dumps({"queues": queues}))


def set_priority(
    dag_id: str,
    run_id: str,
    task_id: str,
    priority: int,
    *,
    map_index: int = -1,
    quota_file: QuotaFile | None = None,
    by: str | None = None,
    session: Session,
) -> QuotaJob:
    """Change the priority of a task instance's active job; the next scheduling cycle uses it.

    The CLI and the REST API both come here, saying ``by`` whom (written to the audit event). Raises
    :class:`JobNotFound` when the task instance has no active job, and :class:`ValueError` naming
    ``priority`` when it is above the ``max_priority`` of the job's quota in ``quota_file`` (a quota
    the file no longer has sets no cap).
    """
    if not isinstance(priority, int) or isinstance(priority, bool):
        raise ValueError(f"priority: {priority!r} is not an integer")
    job = find_job(dag_id, run_id, task_id, map_index=map_index, session=session, active_only=True)
    if quota_file is not None:
        try:
            above = quota_file.quota(job.quota).above_max_priority(priority)
        except PolicyError:
            above = None
        if above is not None:
            raise ValueError(f"priority: {above}")
    old = job.priority
    job.priority = priority
    message = f"priority {old} -> {priority}" + (f" by {by}" if by else "")
    record_event(EventKind.PRIORITY_CHANGED, job=job, session=session, message=message)
    session.flush()
    return job


def show_priority_on_task_instance(job: QuotaJob, *, session: Session) -> None:
    """Write ``job``'s priority to its task instance's ``priority_weight``, which Airflow's UI and API
    show: the job's own priority is what the executor orders by, but without this the task instance
    kept the value of its DAG. The CLI and the REST API call it after :func:`set_priority` (a database
    with Airflow's tables; the policy's own tests have only the provider's)."""
    from airflow.models.taskinstance import TaskInstance

    session.execute(
        update(TaskInstance)
        .where(
            TaskInstance.dag_id == job.dag_id,
            TaskInstance.run_id == job.run_id,
            TaskInstance.task_id == job.task_id,
            TaskInstance.map_index == job.map_index,
        )
        .values(priority_weight=job.priority)
        .execution_options(synchronize_session=False)
    )


def allocate_devices(job: QuotaJob, host: str, devices: Sequence[str], *, session: Session) -> None:
    """Give ``devices`` of ``host`` to ``job``; the primary key (host, device) makes a double grant fail."""
    now = time.time()
    for device in devices:
        session.add(QuotaDeviceAllocation(host=host, device=device, job_id=job.id, allocated_at=now))
    session.flush()


def release_devices(job: QuotaJob, *, session: Session) -> list[str]:
    """Free every device ``job`` holds and record it in the audit log, one event per host (a gang's
    nodes are on several)."""
    held = session.execute(
        select(QuotaDeviceAllocation.host, QuotaDeviceAllocation.device).where(QuotaDeviceAllocation.job_id == job.id)
    ).all()
    by_host: dict[str, list[str]] = {}
    for host, device in held:
        by_host.setdefault(host, []).append(device)
    if held:
        session.execute(delete(QuotaDeviceAllocation).where(QuotaDeviceAllocation.job_id == job.id))
    for host in sorted(by_host, key=lambda h: h != job.host):  # node 0's host first
        devices = sorted(by_host[host], key=device_sort_key)
        record_event(EventKind.RELEASED, job=job, session=session, host=host, devices=",".join(devices))
    return sorted((d for _, d in held), key=device_sort_key)


def count_preemption(job: QuotaJob, *, session: Session) -> int:
    """Add one preemption for the job's task instance; returns the new count."""
    key = (job.dag_id, job.run_id, job.task_id, job.map_index)
    row = session.get(QuotaPreemptionCount, key)
    if row is None:
        row = QuotaPreemptionCount(
            dag_id=job.dag_id, run_id=job.run_id, task_id=job.task_id, map_index=job.map_index, count=0
        )
        session.add(row)
    row.count += 1
    row.last_at = time.time()
    session.flush()
    return row.count


def explain(dag_id: str, run_id: str, task_id: str, *, map_index: int = -1, session: Session) -> dict[str, Any]:
    """Why a task instance's job is where it is: state, pending reason and position, history. Its
    devices per node are the caller's to add (the CLI's job row, from ``usage.held_devices``): merged
    here they would mix a gang's hosts."""
    job = find_job(dag_id, run_id, task_id, map_index=map_index, session=session)
    out = job.to_dict()
    out["preemptions"] = preemption_count(dag_id, run_id, task_id, map_index, session=session)
    out["events"] = [
        {"at": e.at, "kind": e.kind, "reason": e.reason, "victim": e.victim, "preemptor": e.preemptor,
         "host": e.host, "devices": e.devices, "message": e.message}
        for e in session.scalars(
            select(QuotaEvent).where(QuotaEvent.job_id == job.id).order_by(QuotaEvent.id)
        )
    ]
    return out


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
