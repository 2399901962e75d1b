"""Jobs on several hosts (gangs): where each node runs, what each node is told, and the executor's
part that starts the members and ends the gang as one.

A gang's node 0 is its Airflow task instance: launched like any job, on node 0's host, with the
gang's variables (:class:`~airflow_quota_provider.protocol.GangEnvironment`) but ``MASTER_PORT``,
which node 0's host chooses when it starts the launch (:func:`with_master_port`). The other nodes,
the *members*, are not Airflow tasks: once node 0 has published its rendered command (the XCom
``GANG_XCOM_KEY``) and its host its port, the executor starts the same command on every member's
host with that member's rank (:meth:`Gangs.start_members`). Their processes are launches of the
same job like node 0's, contained and tied to their host the same way.

Started together: a member that is not running ``[quota] gang_start_timeout_s`` after the admission,
whose host is lost, or that its host never took, ends the whole gang: node 0's task instance goes
back to the queue without using a retry (as an eviction), and the gang waits a backoff that doubles
with each failed start (Kueue's ``waitForPodsReady``) before it is admitted again; past
``[quota] gang_start_limit`` failed starts its task fails saying so. Stopped together: a member that
exits with an error has node 0 told (a ``gang_node_failed`` notice: its task fails with the member
named); node 0's end ends the members. A gang's devices are freed only when none of its nodes runs.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import delete, select

from airflow.configuration import conf
from airflow.models.xcom import XComModel
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.launcher import Liveness
from airflow_quota_provider.executors.task_instances import fail_ti, set_ti_state
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.gang import GangNode, GangState
from airflow_quota_provider.protocol import (
    ENV_CHECKPOINT_DIR,
    ENV_RESUME_FROM,
    ENV_MASTER_PORT,
    ENV_NNODES,
    ENV_NODE_RANK,
    ENV_RDZV_ENDPOINT,
    ENV_MASTER_ADDR,
    GANG_NODE_FAILED,
    GANG_XCOM_KEY,
    GangCommand,
    GangEnvironment,
    PreemptionNotice,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from sqlalchemy.orm import Session

    from airflow_quota_provider.executors.launcher import Launcher
    from airflow_quota_provider.models.job import QuotaJob

log = logging.getLogger(__name__)

LOCAL_ADDRESS = "127.0.0.1"
"""Node 0's address when every node runs on the scheduler's machine (the local launcher)."""


# ------------------------------------------------------------------------------- on the host


def with_master_port(env: dict[str, str]) -> tuple[dict[str, str], int | None]:
    """Node 0 of a gang gets ``MASTER_PORT``, a port free on its host now (where it starts), and the
    rendezvous endpoint with it; any other launch's ``env`` is returned as it is, with None."""
    if not env.get(ENV_NNODES) or env.get(ENV_NODE_RANK) != "0" or env.get(ENV_MASTER_PORT):
        return env, None
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    return {**env, ENV_MASTER_PORT: str(port), ENV_RDZV_ENDPOINT: f"{env[ENV_MASTER_ADDR]}:{port}"}, port


def run_member(argv: Sequence[str], cwd: str | None, log_file: Path) -> int:  # pragma: no cover - runs in the child
    """A member's command, run as node 0 runs it (:class:`~airflow_quota_provider.operators.process_group.CommandProcess`:
    SIGTERM on a notice, the grace period, SIGKILL), its output in ``log_file``. Returns its exit
    code, 0 when it was stopped by a notice (the gang's outcome is node 0's)."""
    from airflow_quota_provider.operators.process_group import CommandProcess
    from airflow_quota_provider.operators.quota_run import QuotaRun

    member_log = logging.getLogger(f"airflow_quota_provider.member.{os.getpid()}")
    member_log.propagate = False
    handler = logging.FileHandler(log_file)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    member_log.addHandler(handler)
    member_log.setLevel(logging.INFO)
    checkpoint_dir = os.environ.get(ENV_CHECKPOINT_DIR) or str(log_file.parent / "checkpoints")
    resume = os.environ.get(ENV_RESUME_FROM)
    run = QuotaRun.prepare(checkpoint_dir=Path(checkpoint_dir), grace_period_s=None, resume_from=Path(resume) if resume else None)
    rc, preempted = CommandProcess().run(list(argv), env=dict(os.environ), cwd=cwd, run=run, log=member_log)
    member_log.info("Command exited with code %d%s", rc, " (stopped by a notice)" if preempted else "")
    return 0 if preempted else rc


# ----------------------------------------------------------------------------- the scheduler


def placement(job: QuotaJob, hosts: Sequence[str], free: dict[str, list[str]]) -> list[GangNode] | None:
    """Devices for each of ``job``'s nodes on ``hosts`` (one per node; a host named twice gives two
    nodes, as on the local launcher's one host), the lowest free indexes first; None when a host
    has too few free. ``free`` (host -> free devices) loses what is taken."""
    per_node = job.gpus // job.nodes
    taken: dict[str, int] = {}
    nodes = []
    for host in hosts:
        start = taken.get(host, 0)
        devices = free.get(host, [])[start : start + per_node]
        if len(devices) < per_node:
            return None
        taken[host] = start + per_node
        nodes.append(GangNode(host, list(devices)))
    for host, n in taken.items():
        del free[host][:n]
    return nodes


def node_env(job: QuotaJob, rank: int, address: str, port: int | None) -> dict[str, str]:
    """The gang's variables for node ``rank``; node 0's lack ``MASTER_PORT`` (its host adds it)."""
    gang = GangEnvironment(
        nnodes=job.nodes, node_rank=rank, nproc_per_node=job.gpus // job.nodes, master_addr=address,
        master_port=port or 1, rdzv_id=job.job_id,
    ).to_env()
    if port is None:
        del gang[ENV_MASTER_PORT], gang[ENV_RDZV_ENDPOINT]
    return gang


def forget_command(job: QuotaJob, session: Session) -> None:
    """Drop the command an earlier run of node 0 published: the members of this run must get this
    run's (its resume point), and Airflow clears a task's XComs only once it runs."""
    session.execute(delete(XComModel).where(*_command_xcom(job)))


def published_command(job: QuotaJob, session: Session) -> GangCommand | None:
    """The command node 0 published for its members, once it has."""
    row = session.scalars(select(XComModel).where(*_command_xcom(job))).first()
    return None if row is None else GangCommand.from_dict(XComModel.deserialize_value(row))


def _ranks(ranks: Sequence[int]) -> str:
    return f"node {ranks[0]}" if len(ranks) == 1 else f"nodes {', '.join(map(str, ranks))}"


def _command_xcom(job: QuotaJob) -> tuple:
    """The XCom row of the command node 0 of ``job``'s task instance publishes."""
    return (
        XComModel.dag_id == job.dag_id, XComModel.run_id == job.run_id, XComModel.task_id == job.task_id,
        XComModel.map_index == job.map_index, XComModel.key == GANG_XCOM_KEY,
    )


class Gangs:
    """The executor's part for gangs: starts their members, watches them, and ends a gang as one."""

    def __init__(self, launcher: Launcher) -> None:
        self.launcher = launcher

    @staticmethod
    def start_timeout_s() -> float:
        return conf.getfloat("quota", "gang_start_timeout_s", fallback=300.0)

    def start_members(
        self, job: QuotaJob, gang: GangState, env_of: Callable[[GangNode], dict[str, str]], session: Session
    ) -> bool:
        """Start the members of a running gang once node 0 has published its command and its host
        its port; whether it did. ``env_of``: a node's ``QUOTA_*`` variables and devices."""
        if not job.handle or all(n.handle for n in gang.nodes[1:]):
            return False
        port = self.launcher.gang_port(job.handle, session=session)
        try:
            command = published_command(job, session) if port else None
        except ValueError as e:
            self.end(job, gang, f"node 0 published a malformed command: {e}", start_failed=True, session=session)
            return True
        if command is None:
            return False
        address = self.launcher.address(gang.nodes[0].host, session=session)
        for rank, node in enumerate(gang.nodes):
            if rank == 0 or node.handle:
                continue
            env = {**command.env, **env_of(node), **node_env(job, rank, address, port)}
            node.handle = self.launcher.launch_member(
                job_id=job.id, node_rank=rank, host=node.host, argv=command.argv, cwd=command.cwd, env=env, session=session
            )
            log.info("Started node %d of %d of %s on %s (GPUs %s)", rank, job.nodes, job.ti_label(), node.host, ",".join(node.devices))
        gang.save(job)
        return True

    def watch(self, job: QuotaJob, gang: GangState, now: float, session: Session) -> bool:
        """A running gang's members: one lost, never taken by its host, or not started in time ends
        the gang; one that failed has node 0 told. Whether anything changed."""
        if gang.ending:
            return False
        members = gang.member_handles()
        statuses = self.launcher.status({h: job.id for h in members.values()}, session=session) if members else {}
        for rank, handle in members.items():
            status = statuses[handle]
            where = f"node {rank} of {job.nodes} on host {gang.nodes[rank].host}"
            if status.liveness == Liveness.LOST:
                return self.end(job, gang, f"{where} lost", start_failed=False, session=session)
            if status.liveness == Liveness.NEVER_STARTED:
                return self.end(job, gang, f"{where} was never taken by its host", start_failed=True, session=session)
            if status.liveness == Liveness.ENDED and status.rc != 0 and not gang.told_node_failed:
                how = "was killed" if status.rc is None else f"exited with code {status.rc}"
                self._tell_node_failed(job, gang, rank, f"{where} {how}", session)
                return True
        unpublished = [r for r in range(1, job.nodes) if r not in members]
        untaken = [rank for rank, handle in members.items() if not statuses[handle].taken]
        if (unpublished or untaken) and job.started_at is not None and now - job.started_at > self.start_timeout_s():
            why = [f"node 0 has not published its command for {_ranks(unpublished)}"] if unpublished else []
            why += [f"the hosts of {_ranks(untaken)} have not taken their launch"] if untaken else []
            return self.end(
                job, gang, f"nodes {', '.join(str(r) for r in sorted(unpublished + untaken))} not started "
                f"{self.start_timeout_s():g} s after the admission ({'; '.join(why)})", start_failed=True, session=session,
            )
        return False

    def _tell_node_failed(self, job: QuotaJob, gang: GangState, failed: int, what: str, session: Session) -> None:
        """Node 0 stops its command and fails its task saying ``what``; the other members are killed."""
        notice = PreemptionNotice(GANG_NODE_FAILED, None, None, message=f"gang stopped: {what}")
        try:
            self.launcher.notify(job.handle, notice.to_dict(), session=session)
        except Exception:
            log.exception("Could not tell node 0 of %s that %s", job.ti_label(), what)
        for rank, handle in gang.member_handles().items():
            if rank != failed:
                self.launcher.kill(handle, session=session)
        gang.told_node_failed = True
        gang.save(job)
        log.warning("%s: %s; its task fails", job.ti_label(), what)

    def end(self, job: QuotaJob, gang: GangState, why: str, *, start_failed: bool, session: Session) -> bool:
        """End the gang without using a retry: its task instance is set back to the queue (node 0's
        supervisor then ends it), every node is killed; it is settled once none runs."""
        gang.ending, gang.start_failed = why, start_failed
        gang.save(job)
        transitions.end_gang(job)
        set_ti_state(job, TaskInstanceState.UP_FOR_RESCHEDULE, from_states=[TaskInstanceState.RUNNING, TaskInstanceState.QUEUED], session=session)
        for handle in [job.handle, *gang.member_handles().values()]:
            if handle:
                self.launcher.kill(handle, session=session)
        log.warning("Ending the gang %s: %s", job.ti_label(), why)
        return True

    def members_left(self, job: QuotaJob, gang: GangState, session: Session) -> bool:
        """Node 0 is gone: kill the members that still run; whether any does (the gang's devices are
        freed only when none runs). Those done are forgotten."""
        members = gang.member_handles()
        if not members:
            return False
        left = False
        for handle, status in self.launcher.status({h: job.id for h in members.values()}, session=session).items():
            if status.liveness in (Liveness.RUNNING, Liveness.TASK_EXITED):
                self.launcher.kill(handle, session=session)
                left = True
        if not left:
            for handle in members.values():
                self.launcher.forget(handle, session=session)
        return left

    def notify(self, job: QuotaJob, notice: dict, session: Session) -> None:
        """A preemption reaches every member too."""
        if not job.gang:
            return
        for handle in GangState.of(job).member_handles().values():
            try:
                self.launcher.notify(handle, notice, session=session)
            except Exception:
                log.exception("Could not deliver the preemption notice to a member of %s", job.ti_label())

    def after_end(self, job: QuotaJob, gang: GangState, now: float, session: Session) -> tuple[str, bool]:
        """A gang that the executor ended has no node left: why (to evict it with), and whether its
        task failed instead, past ``[quota] gang_start_limit`` failed starts. A failed start sets its
        backoff: ``[quota] gang_backoff_s``, doubling with each."""
        why, failed = f"gang ended: {gang.ending}", False
        if gang.start_failed:
            gang.start_failures += 1
            limit = conf.getint("quota", "gang_start_limit", fallback=5)
            if gang.start_failures > limit:
                why = f"the gang did not start {gang.start_failures} times ([quota] gang_start_limit {limit}); last: {gang.ending}"
                fail_ti(job, f"QuotaExecutor: {why}", session, from_states=_NOT_ENDED)
                failed = True
            else:
                backoff = conf.getfloat("quota", "gang_backoff_s", fallback=60.0) * 2 ** (gang.start_failures - 1)
                gang.not_before = now + backoff
                why += f"; admitted again after {backoff:g} s (start {gang.start_failures} of {limit + 1})"
        gang.nodes, gang.ending, gang.start_failed, gang.told_node_failed = [], None, False, False
        gang.save(job)
        return why, failed


_NOT_ENDED = [TaskInstanceState.UP_FOR_RESCHEDULE, TaskInstanceState.QUEUED, TaskInstanceState.SCHEDULED, TaskInstanceState.RUNNING]
