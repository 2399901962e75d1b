"""GPU hosts of the fleet and the launches sent to them, with one function per state change.

A host is a machine that runs ``airflow quota worker``: it registers its name, the job queues it
serves and its GPU indexes, then heartbeats. A host silent for ``[quota] host_lost_after_s`` is
*lost*: its devices leave the pool until it *rejoins*: its worker first ends whatever of its launches
still runs there (the scheduler gave them up and runs their jobs elsewhere), and only then says so
(:func:`rejoin_host`); a worker that starts again does the same before :func:`register_host`. A *launch* is one start of one job on
one host, named by a handle (the Celery task id); the worker moves it from ``sent`` to ``started``
only if nobody cancelled it meanwhile, so a message the broker redelivers late never starts a job a
second time.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

from sqlalchemy import Float, ForeignKey, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, mapped_column

from airflow_quota_provider.models.base import QuotaBase
from airflow_quota_provider.models.coordination import db_now
from airflow_quota_provider.models.job import EventKind, record_event

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from sqlalchemy.orm import Session


class HostState(str, Enum):
    """Whether a host's devices are in the pool; stored in ``quota_host.state``."""

    ACTIVE = "active"
    """Heartbeating: its devices are handed out."""
    LOST = "lost"
    """Silent past ``[quota] host_lost_after_s``: its devices are out of the pool, its jobs requeued.
    Heartbeats alone do not bring it back: :func:`rejoin_host` does, once none of its launches runs."""


class LaunchState(str, Enum):
    """Where one launch is; stored in ``quota_launch.state``."""

    SENT = "sent"
    """Published to the host's queue; the worker has not taken it yet."""
    STARTED = "started"
    """The worker took it and runs the task supervisor."""
    TASK_EXITED = "task_exited"
    """The task and everything it started are gone; the supervisor is still finishing (it may notice
    a whole heartbeat late). Once the task instance says how the try ended, the devices are free."""
    ENDED = "ended"
    """The supervisor returned (``rc``); how the try ended is the task instance's state."""
    CANCELLED = "cancelled"
    """Given up by the scheduler (host lost, job requeued): a late delivery must not start it."""


class QuotaHost(QuotaBase):
    """One GPU host of the fleet."""

    __tablename__ = "quota_host"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)
    queues: Mapped[str] = mapped_column(Text, nullable=False)
    """Comma-separated job queues (of the quota file) that the host serves."""
    devices: Mapped[str] = mapped_column(Text, nullable=False)
    """Comma-separated GPU indexes."""
    celery_name: Mapped[str | None] = mapped_column(String(255))
    """The Celery worker's node name (``celery@HOST``), the destination of remote-control commands."""
    address: Mapped[str | None] = mapped_column(String(255))
    """Where the host's peers reach it (a gang's ``MASTER_ADDR`` when it runs node 0); None: its name."""
    gpu_type: Mapped[str | None] = mapped_column(String(64))
    """Its GPUs' type (a host holds one), from ``nvidia-smi`` or ``--gpu-type``; a typed job queue's
    policy counts the host for that type only. None: untyped."""
    state: Mapped[str] = mapped_column(String(20), nullable=False, default=HostState.ACTIVE.value)
    registered_at: Mapped[float] = mapped_column(Float, nullable=False)
    heartbeat_at: Mapped[float] = mapped_column(Float, nullable=False)
    lost_at: Mapped[float | None] = mapped_column(Float)

    @property
    def device_list(self) -> list[str]:
        return [d for d in self.devices.split(",") if d]

    @property
    def queue_list(self) -> list[str]:
        return [q for q in self.queues.split(",") if q]

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "queues": self.queue_list,
            "devices": self.device_list,
            "gpu_type": self.gpu_type,
            "state": self.state,
            "heartbeat_at": self.heartbeat_at,
            "lost_at": self.lost_at,
        }


class QuotaLaunch(QuotaBase):
    """One start of one job on one host."""

    __tablename__ = "quota_launch"

    handle: Mapped[str] = mapped_column(String(255), primary_key=True)
    job_id: Mapped[int] = mapped_column(Integer, ForeignKey("quota_job.id", ondelete="CASCADE"), nullable=False)
    host: Mapped[str] = mapped_column(String(255), nullable=False)
    state: Mapped[str] = mapped_column(String(20), nullable=False, default=LaunchState.SENT.value)
    rc: Mapped[int | None] = mapped_column(Integer)
    node_rank: Mapped[int] = mapped_column(Integer, nullable=False, default=0, server_default="0")
    """Which node of its job the launch starts: 0 is the task itself, above 0 a gang's member."""
    port: Mapped[int | None] = mapped_column(Integer)
    """A gang's node 0: the ``MASTER_PORT`` its host chose, free there when the launch started."""
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    """The worker process that runs the task supervisor (on ``host``), for a hard kill there."""
    sent_at: Mapped[float] = mapped_column(Float, nullable=False)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)


# --------------------------------------------------------------------------------------------------
# Hosts


def register_host(
    name: str, *, queues: Sequence[str], devices: Sequence[str], celery_name: str | None, address: str | None = None,
    gpu_type: str | None = None, session: Session,
) -> QuotaHost:
    """Add the host or update what it serves; it is active from now on. Its worker calls this only
    once no launch of an earlier run of it is left on the machine."""
    now = db_now(session)
    host = session.get(QuotaHost, name)
    if host is None:
        host = QuotaHost(name=name, registered_at=now)
        session.add(host)
    host.queues, host.devices, host.celery_name = ",".join(queues), ",".join(devices), celery_name
    host.address, host.gpu_type = address, gpu_type
    host.state, host.heartbeat_at, host.lost_at = HostState.ACTIVE.value, now, None
    record_event(
        EventKind.HOST_JOINED, session=session, host=name, devices=host.devices,
        message=f"serves {host.queues} with {len(devices)} GPUs" + (f" of type {gpu_type}" if gpu_type else ""),
    )
    session.flush()
    return host


def heartbeat_host(name: str, *, session: Session) -> HostState | None:
    """Record that the host is alive; returns its state (None: not registered). A lost host stays
    lost: its worker must end its evicted launches and :func:`rejoin_host` first."""
    host = session.get(QuotaHost, name)
    if host is None:
        return None
    host.heartbeat_at = db_now(session)  # the schedulers judge it by the same clock
    session.flush()
    return HostState(host.state)


def rejoin_host(name: str, *, session: Session) -> None:
    """``lost`` -> ``active``: the host's worker has ended every launch of its own that was still
    running (the scheduler evicted them when it lost the host) and seen them gone; its devices are
    handed out again from now on. Raises ValueError naming the host and its state otherwise."""
    host = session.get(QuotaHost, name)
    if host is None or host.state != HostState.LOST.value:
        raise ValueError(f"host {name!r} cannot rejoin: it is {host.state if host else 'not registered'}, not lost")
    host.state, host.heartbeat_at, host.lost_at = HostState.ACTIVE.value, db_now(session), None
    record_event(
        EventKind.HOST_JOINED, session=session, host=name, devices=host.devices,
        message="back after it was lost; none of its evicted launches runs",
    )
    session.flush()


def mark_lost_hosts(lost_after_s: float, *, now: float, session: Session) -> list[QuotaHost]:
    """Mark every active host silent for more than ``lost_after_s`` as lost; returns them."""
    lost = session.scalars(
        select(QuotaHost).where(QuotaHost.state == HostState.ACTIVE.value, QuotaHost.heartbeat_at < now - lost_after_s)
    ).all()
    for host in lost:
        host.state, host.lost_at = HostState.LOST.value, now
        record_event(
            EventKind.HOST_LOST, session=session, host=host.name, devices=host.devices,
            message=f"no heartbeat for {now - host.heartbeat_at:.0f} s (host_lost_after_s {lost_after_s:g})",
        )
    return list(lost)


def list_hosts(*, session: Session, active_only: bool = False) -> Sequence[QuotaHost]:
    query = select(QuotaHost).order_by(QuotaHost.name)
    if active_only:
        query = query.where(QuotaHost.state == HostState.ACTIVE.value)
    return session.scalars(query).all()


# --------------------------------------------------------------------------------------------------
# Launches


def launch_key(job_id: int, node_rank: int) -> str:
    """What names a launch on its host (its job directory): the job id; ``JOB-N`` for node N > 0 of a gang."""
    return f"{job_id}-{node_rank}" if node_rank else str(job_id)


def record_launch(handle: str, *, job_id: int, host: str, node_rank: int = 0, session: Session) -> QuotaLaunch:
    launch = QuotaLaunch(
        handle=handle, job_id=job_id, host=host, node_rank=node_rank, state=LaunchState.SENT.value, sent_at=db_now(session)
    )
    session.add(launch)
    session.flush()
    return launch


def start_launch(handle: str, *, worker_pid: int, port: int | None = None, session: Session) -> bool:
    """``sent`` -> ``started`` (``port``: a gang's node 0's ``MASTER_PORT``); False when the launch
    was cancelled or is unknown (do not run it)."""
    result = session.execute(
        update(QuotaLaunch)
        .where(QuotaLaunch.handle == handle, QuotaLaunch.state == LaunchState.SENT.value)
        .values(state=LaunchState.STARTED.value, started_at=db_now(session), worker_pid=worker_pid, port=port)
        .execution_options(synchronize_session=False)
    )
    return bool(result.rowcount)


def task_exited(handle: str, *, session: Session) -> None:
    """``started`` -> ``task_exited``."""
    session.execute(
        update(QuotaLaunch)
        .where(QuotaLaunch.handle == handle, QuotaLaunch.state == LaunchState.STARTED.value)
        .values(state=LaunchState.TASK_EXITED.value)
        .execution_options(synchronize_session=False)
    )


def end_launch(handle: str, *, rc: int | None, session: Session) -> None:
    """``started`` or ``task_exited`` -> ``ended`` with the supervisor's exit code (None: killed)."""
    session.execute(
        update(QuotaLaunch)
        .where(QuotaLaunch.handle == handle, QuotaLaunch.state.in_([LaunchState.STARTED.value, LaunchState.TASK_EXITED.value]))
        .values(state=LaunchState.ENDED.value, rc=rc, ended_at=db_now(session))
        .execution_options(synchronize_session=False)
    )


def end_dead_launches(host: str, alive: Callable[[int, str], bool], *, session: Session) -> list[str]:
    """End (exit code unknown) the launches on ``host`` of which nothing lives any more
    (``alive(worker_pid, key)`` is False, ``key`` naming the launch's job directory: neither the pool process, nor anything the launch
    started): the pool process died before it could record the end itself (killed, out of memory),
    and its job would hold its GPUs for ever."""
    rows = session.execute(
        select(QuotaLaunch.handle, QuotaLaunch.worker_pid, QuotaLaunch.job_id, QuotaLaunch.node_rank).where(
            QuotaLaunch.host == host,
            QuotaLaunch.state.in_([LaunchState.STARTED.value, LaunchState.TASK_EXITED.value]),
            QuotaLaunch.worker_pid.is_not(None),
        )
    ).all()
    dead = [handle for handle, pid, job_id, rank in rows if not alive(pid, launch_key(job_id, rank))]
    if dead:
        session.execute(
            update(QuotaLaunch)
            .where(QuotaLaunch.handle.in_(dead), QuotaLaunch.state.in_([LaunchState.STARTED.value, LaunchState.TASK_EXITED.value]))
            .values(state=LaunchState.ENDED.value, rc=None, ended_at=db_now(session))
            .execution_options(synchronize_session=False)
        )
    return dead


def cancel_launches(handles: Iterable[str], *, session: Session) -> None:
    """Give up launches that have not ended (their host is lost or their job was requeued)."""
    handles = list(handles)
    if handles:
        session.execute(
            update(QuotaLaunch)
            .where(
                QuotaLaunch.handle.in_(handles),
                QuotaLaunch.state.in_([LaunchState.SENT.value, LaunchState.STARTED.value, LaunchState.TASK_EXITED.value]),
            )
            .values(state=LaunchState.CANCELLED.value, ended_at=db_now(session))
            .execution_options(synchronize_session=False)
        )


def launches(handles: Iterable[str], *, session: Session) -> dict[str, QuotaLaunch]:
    handles = list(handles)
    if not handles:
        return {}
    return {launch.handle: launch for launch in session.scalars(select(QuotaLaunch).where(QuotaLaunch.handle.in_(handles)))}
