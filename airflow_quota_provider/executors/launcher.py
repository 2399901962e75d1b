"""The seam between QuotaExecutor and where task processes run.

A launcher starts an admitted job's task on devices of one host and hands back an opaque *handle*;
afterwards the executor asks which handles still run, delivers preemption notices and kills, by
handle alone. A gang's other nodes are launches of the same job, each with a handle of its own
(:mod:`.gangs`). :class:`~airflow_quota_provider.executors.local_launcher.LocalLauncher` forks on the
scheduler's machine; :class:`~airflow_quota_provider.executors.celery_launcher.CeleryLauncher`
sends the job to a GPU host's Celery worker. The executor knows neither pids nor notice files.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow.executors.workloads import ExecuteTask
    from airflow_quota_provider.policy import QuotaFile


class Liveness(str, Enum):
    """What a launcher knows of one handle."""

    RUNNING = "running"
    """The task's process (or its supervisor) still runs, or has not started yet."""
    TASK_EXITED = "task_exited"
    """The task ran, and it and everything it started are gone; its supervisor is still finishing.
    Once the task instance says the try ended (or, for a preempted job, that it is on its way back
    to the queue), the devices are free."""
    ENDED = "ended"
    """The supervisor is gone; ``rc`` is its exit code, None when it was killed."""
    LOST = "lost"
    """Its host is lost: nothing more will be heard of it."""
    NEVER_STARTED = "never_started"
    """Sent, and not taken by its host within ``[quota] launch_start_timeout_s`` (a message lost
    with a broker restart): the launch is undone and the job goes back to its place."""


@dataclass(frozen=True)
class Status:
    liveness: Liveness
    rc: int | None = None
    taken: bool = True
    """False while a launch is sent and its host has not taken it yet (``RUNNING`` then; it may still
    be, until ``NEVER_STARTED``): a gang's member is not started before its host takes it."""


@dataclass(frozen=True)
class HostDevices:
    """GPUs one host gives to one job queue."""

    name: str
    queue: str
    devices: tuple[str, ...]
    up: bool = True
    """False while the host is lost: its devices are out of the pool until it returns."""
    gpu_type: str | None = None
    """Its GPUs' type (a host holds one); None: untyped, which a job queue with GPU types cannot use."""


@dataclass(frozen=True)
class Launch:
    """One admitted job's start: its workload on ``host``, with ``env`` (``CUDA_VISIBLE_DEVICES`` and
    ``QUOTA_*``) added to the environment."""

    job_id: int
    host: str
    workload: ExecuteTask
    env: dict[str, str]


class Launcher(Protocol):
    places_on_hosts: bool
    """True when jobs may land on several hosts, so the policy places them (DESIGN §2, hosts);
    False for one implicit host per queue (the policy behaves exactly as without hosts)."""

    def hosts(self, quota_file: QuotaFile, *, session: Session) -> list[HostDevices]:
        """The hosts per job queue, with whether their devices are in the pool now."""

    def launch_all(self, launches: Sequence[Launch], *, session: Session) -> list[str | Exception]:
        """Start a cycle's admitted jobs, each launch's handle or why it could not start, in order:
        all at once, so that the last owner of a reclaim does not wait on the others' round trips."""

    def launch_member(
        self, *, job_id: int, node_rank: int, host: str, argv: list[str], cwd: str | None, env: dict[str, str], session: Session
    ) -> str:
        """Start node ``node_rank`` (> 0) of a gang on ``host``: ``argv`` with ``env`` added, stopped by
        its notices as node 0's command is; returns the handle."""

    def gang_port(self, handle: str, *, session: Session) -> int | None:
        """The ``MASTER_PORT`` that node 0's host chose for the gang launched as ``handle``, once known."""

    def address(self, host: str, *, session: Session) -> str:
        """Where the other nodes of a gang reach ``host`` (``MASTER_ADDR``)."""

    def recorded_launch(self, job_id: int, *, since: float, session: Session) -> str | None:
        """The handle of the job's launch (node 0's) recorded at or after ``since`` (its admission), if any."""
        ...

    def status(self, handles: Mapping[str, int], *, session: Session) -> dict[str, Status]:
        """Liveness of each handle (``handle -> job id``)."""

    def notify(self, handle: str, notice: dict, *, session: Session) -> None:
        """Deliver a preemption notice to the task (``QUOTA_PREEMPT_FILE`` on its host)."""

    def kill(self, handle: str, *, session: Session) -> None:
        """Kill the task's process tree now."""

    def forget(self, handle: str, *, session: Session) -> None:
        """The executor is done with ``handle`` (its job was settled)."""
