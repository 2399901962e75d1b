"""GPU hosts of the fleet and the launches sent to them, with one function per state change.

A host is a machine that runs ``airflow quota worker``: it registers its name, the job queues it
serves and its GPU indexes, then heartbeats. A host silent for ``[quota] host_lost_after_s`` is
*lost*: its devices leave the pool until it heartbeats again. A *launch* is one start of one job on
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
    """Silent past ``[quota] host_lost_after_s``: its devices are out of the pool, its jobs requeued."""


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
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    """The worker process that runs the task supervisor (on ``host``), for a hard kill there."""
    sent_at: Mapped[float] = mapped_column(Float, nullable=False)
    started_at: Mapped[float | None] = mapped_column(Float)
    ended_at: Mapped[float | None] = mapped_column(Float)


# --------------------------------------------------------------------------------------------------
# Hosts


def register_host(
    name: str, *, queues: Sequence[str], devices: Sequence[str], celery_name: str | None, session: Session
) -> QuotaHost:
    """Add the host or update what it serves; it is active from now on."""
    now = db_now(session)
    host = session.get(QuotaHost, name)
    if host is None:
        host = QuotaHost(name=name, registered_at=now)
        session.add(host)
    host.queues, host.devices, host.celery_name = ",".join(queues), ",".join(devices), celery_name
    host.state, host.heartbeat_at, host.lost_at = HostState.ACTIVE.value, now, None
    record_event(
        EventKind.HOST_JOINED, session=session, host=name, devices=host.devices,
        message=f"serves {host.queues} with {len(devices)} GPUs",
    )
    session.flush()
    return host


def heartbeat_host(name: str, *, session: Session) -> bool:
    """Record that the host is alive; a lost host rejoins. False when the host is not registered."""
    host = session.get(QuotaHost, name)
    if host is None:
        return False
    host.heartbeat_at = db_now(session)  # the schedulers judge it by the same clock
    if host.state == HostState.LOST.value:
        host.state, host.lost_at = HostState.ACTIVE.value, None
        record_event(EventKind.HOST_JOINED, session=session, host=name, devices=host.devices, message="back after it was lost")
    session.flush()
    return True


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


def record_launch(handle: str, *, job_id: int, host: str, session: Session) -> QuotaLaunch:
    launch = QuotaLaunch(handle=handle, job_id=job_id, host=host, state=LaunchState.SENT.value, sent_at=db_now(session))
    session.add(launch)
    session.flush()
    return launch


def start_launch(handle: str, *, worker_pid: int, session: Session) -> bool:
    """``sent`` -> ``started``; False when the launch was cancelled or is unknown (do not run it)."""
    result = session.execute(
        update(QuotaLaunch)
        .where(QuotaLaunch.handle == handle, QuotaLaunch.state == LaunchState.SENT.value)
        .values(state=LaunchState.STARTED.value, started_at=db_now(session), worker_pid=worker_pid)
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


def end_launch(handle: str, *, rc: int, session: Session) -> None:
    session.execute(
        update(QuotaLaunch)
        .where(QuotaLaunch.handle == handle, QuotaLaunch.state.in_([LaunchState.STARTED.value, LaunchState.TASK_EXITED.value]))
        .values(state=LaunchState.ENDED.value, rc=rc, ended_at=db_now(session))
        .execution_options(synchronize_session=False)
    )


def end_dead_launches(host: str, alive: Callable[[int], bool], *, session: Session) -> list[str]:
    """End (exit code unknown) the launches on ``host`` whose pool process is gone: it died before it
    could record the end itself (killed, out of memory), and its job would hold its GPUs for ever."""
    rows = session.execute(
        select(QuotaLaunch.handle, QuotaLaunch.worker_pid).where(
            QuotaLaunch.host == host,
            QuotaLaunch.state.in_([LaunchState.STARTED.value, LaunchState.TASK_EXITED.value]),
            QuotaLaunch.worker_pid.is_not(None),
        )
    ).all()
    dead = [handle for handle, pid in rows if not alive(pid)]
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
