"""The scheduler's side of the Celery launcher: jobs go to the GPU host the policy chose.

Hosts register themselves (``airflow quota worker``, table ``quota_host``); their devices are the
pool. A launch is a row in ``quota_launch`` (committed first, so that the worker can tell a live
launch from a cancelled one) and a message published by task name to the host's own Celery queue,
with a fresh task id as the handle. Preemption notices and hard kills are Celery remote-control
commands addressed to that one worker; outcomes come from Airflow's task instance state and the
launch row, never from Celery's result state (a task that trapped SIGTERM ends SUCCESS there).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from sqlalchemy import select

from airflow.configuration import conf
from airflow_quota_provider.executors.celery_worker import MEMBER_TASK_NAME, TASK_NAME, host_queue
from airflow_quota_provider.executors.launcher import HostDevices, Launch, Liveness, Status
from airflow_quota_provider.models.coordination import db_now
from airflow_quota_provider.models.host import (
    HostState,
    LaunchState,
    QuotaHost,
    QuotaLaunch,
    cancel_launches,
    launch_key,
    launches,
    record_launch,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_quota_provider.policy import QuotaFile


_CANCELLED, _ENDED, _SENT = LaunchState.CANCELLED.value, LaunchState.ENDED.value, LaunchState.SENT.value
_TASK_EXITED = LaunchState.TASK_EXITED.value


class CeleryLauncher:
    places_on_hosts = True

    def __init__(self, app=None) -> None:
        if app is None:
            from airflow.providers.celery.executors.celery_executor_utils import app
        self.app = app

    def hosts(self, quota_file: QuotaFile, *, session: Session) -> list[HostDevices]:
        rows = session.execute(
            select(QuotaHost.name, QuotaHost.queues, QuotaHost.devices, QuotaHost.state, QuotaHost.gpu_type)
            .order_by(QuotaHost.name)
        )
        return [
            HostDevices(
                name, queue, tuple(d for d in devices.split(",") if d), up=state == HostState.ACTIVE.value, gpu_type=gpu_type
            )
            for name, queues, devices, state, gpu_type in rows
            for queue in queues.split(",")
            if queue
        ]

    def launch_all(self, launches: Sequence[Launch], *, session: Session) -> list[str | Exception]:
        """Record every launch, commit once, then send them one after the other."""
        handles = [f"quota-{launch.job_id}-{uuid.uuid4().hex}" for launch in launches]  # workers remember revoked ids
        for launch, handle in zip(launches, handles):
            record_launch(handle, job_id=launch.job_id, host=launch.host, session=session)
        session.commit()
        out: list[str | Exception] = []
        for launch, handle in zip(launches, handles):
            try:
                self.app.send_task(
                    TASK_NAME, args=(launch.workload.model_dump_json(), launch.job_id, launch.env),
                    queue=host_queue(launch.host), task_id=handle,
                )
            except Exception as e:
                cancel_launches([handle], session=session)
                out.append(e)
            else:
                out.append(handle)
        return out

    def launch_member(
        self, *, job_id: int, node_rank: int, host: str, argv: list[str], cwd: str | None, env: dict[str, str], session: Session
    ) -> str:
        handle = f"quota-{job_id}-{node_rank}-{uuid.uuid4().hex}"
        record_launch(handle, job_id=job_id, host=host, node_rank=node_rank, session=session)
        session.commit()
        try:
            self.app.send_task(
                MEMBER_TASK_NAME, args=(job_id, node_rank, list(argv), cwd, env), queue=host_queue(host), task_id=handle
            )
        except Exception:
            cancel_launches([handle], session=session)
            raise
        return handle

    def gang_port(self, handle: str, *, session: Session) -> int | None:
        return session.scalar(select(QuotaLaunch.port).where(QuotaLaunch.handle == handle))

    def address(self, host: str, *, session: Session) -> str:
        return session.scalar(select(QuotaHost.address).where(QuotaHost.name == host)) or host

    def recorded_launch(self, job_id: int, *, since: float, session: Session) -> str | None:
        return session.scalar(
            select(QuotaLaunch.handle)
            .where(QuotaLaunch.job_id == job_id, QuotaLaunch.node_rank == 0, QuotaLaunch.sent_at >= since, QuotaLaunch.state != _CANCELLED)
            .order_by(QuotaLaunch.sent_at.desc())
            .limit(1)
        )

    def status(self, handles: Mapping[str, int], *, session: Session) -> dict[str, Status]:
        """From the launch rows (plain rows: thousands run at once) and the lost hosts."""
        rows = {
            handle: (state, rc, host, sent_at)
            for handle, state, rc, host, sent_at in session.execute(
                select(QuotaLaunch.handle, QuotaLaunch.state, QuotaLaunch.rc, QuotaLaunch.host, QuotaLaunch.sent_at).where(
                    QuotaLaunch.job_id.in_(set(handles.values()))
                )
            )
        }
        sent_before = db_now(session) - conf.getfloat("quota", "launch_start_timeout_s", fallback=60.0)
        lost = set(session.scalars(select(QuotaHost.name).where(QuotaHost.state == HostState.LOST.value)))
        running, ended, sent = Status(Liveness.RUNNING), Status(Liveness.ENDED), Status(Liveness.RUNNING, taken=False)
        out = {}
        for handle in handles:
            state, rc, host, sent_at = rows.get(handle, (_CANCELLED, None, None, None))
            if state == _SENT:
                out[handle] = Status(Liveness.NEVER_STARTED) if sent_at < sent_before else sent
            elif state == _CANCELLED:
                out[handle] = ended
            elif state == _ENDED:
                out[handle] = Status(Liveness.ENDED, rc)
            elif host in lost:
                out[handle] = Status(Liveness.LOST)
            elif state == _TASK_EXITED:
                out[handle] = Status(Liveness.TASK_EXITED)
            else:
                out[handle] = running
        return out

    def notify(self, handle: str, notice: dict, *, session: Session) -> None:
        launch = launches([handle], session=session).get(handle)
        if launch is not None:
            key = launch_key(launch.job_id, launch.node_rank)
            self._command(launch.host, "quota_notify", {"job_id": key, "notice": notice}, session)

    def kill(self, handle: str, *, session: Session) -> None:
        launch = launches([handle], session=session).get(handle)
        if launch is None:
            return
        if launch.worker_pid:  # the pool process lives on to record the end
            self._command(launch.host, "quota_kill", {"worker_pid": launch.worker_pid}, session)
        # Not started yet: never start it. (terminate=True would kill the pool process itself,
        # which then could not record the end, and the job would hold its GPUs.)
        self.app.control.revoke(handle, destination=self._destination(launch.host, session))

    def forget(self, handle: str, *, session: Session) -> None:
        cancel_launches([handle], session=session)

    def _destination(self, host: str, session: Session) -> list[str] | None:
        row = session.get(QuotaHost, host)
        return [row.celery_name] if row is not None and row.celery_name else None

    def _command(self, host: str, name: str, arguments: dict, session: Session) -> None:
        destination = self._destination(host, session)
        if destination is None:
            raise LookupError(f"host {host!r} is not registered: cannot send it {name}")
        self.app.control.broadcast(name, arguments=arguments, destination=destination, reply=False)
