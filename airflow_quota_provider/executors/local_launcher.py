"""Local GPU launcher: one forked process per admitted task, on the scheduler's own machine.

Each task runs in its own session (``setsid``) so that it outlives a scheduler that dies: a restarted
scheduler re-adopts it from the job's files. The launcher writes ``pid`` when it forks the child,
and the child writes ``exit-PID`` when the Airflow task supervisor returns; a process that vanishes
without its exit file was killed.

The forked child is the Airflow task supervisor, and the task runs in the supervisor's own child
process. The supervisor may notice that child's exit up to ``[workers] min_heartbeat_interval``
(5 s) late: when the task's sockets reach EOF a moment before the kernel reports its exit, it
sleeps a full heartbeat interval before looking again. :meth:`LocalLauncher.task_exited` sees the
exit at once, so that the GPUs are not held idle meanwhile. The supervisor is made a child
subreaper, so that processes the task started (a training command in a session of its own, say)
stay its descendants after the task exits: the GPUs are free only when all of them are gone.
"""

from __future__ import annotations

import ctypes
import gc
import json
import logging
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_quota_provider.executors.launcher import HostDevices, Liveness, Status

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow.executors.workloads import ExecuteTask
    from airflow_quota_provider.policy import QuotaFile

log = logging.getLogger(__name__)

PID_FILE = "pid"
EXIT_FILE = "exit-{pid}"  # one per launch: a supervisor still finishing never writes a newer launch's
PREEMPT_FILE = "preempt.json"
PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True)
class ExitInfo:
    """How a task process ended: ``rc`` from the supervisor, or None when it was killed."""

    rc: int | None


def _stat_field(pid: int | str, index: int) -> str | None:
    """Field ``index`` after the command name of ``/proc/PID/stat`` (0: state, 19: start time), or
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def _proc_start_time(pid: int) -> str | None:
    return _stat_field(pid, 19)


class LocalLauncher:
    """Starts, watches and kills task processes on this machine: one implicit host, ``local``,
    whose devices the job queues of the quota file share in file order. A handle is ``JOB:PID``."""

    places_on_hosts = False
    HOST = "local"

    def __init__(self, state_dir: Path, devices: list[str] | None = None) -> None:
        self.state_dir = state_dir
        self.devices = list(devices or [])
        self._children: dict[int, int] = {}
        """pid -> exit status for processes this scheduler forked (reaped with waitpid)."""
        self._lingering: set[int] = set()
        """Forgotten children still finishing (see :meth:`task_exited`); reaped when they exit."""

    def job_dir(self, job_id: int) -> Path:
        return self.state_dir / "jobs" / str(job_id)

    def preempt_file(self, job_id: int) -> Path:
        return self.job_dir(job_id) / PREEMPT_FILE

    # -- the Launcher protocol ---------------------------------------------------------------

    def hosts(self, quota_file: QuotaFile, *, session: Session) -> list[HostDevices]:
        from airflow_quota_provider.executors.config import split_devices

        return [
            HostDevices(self.HOST, queue, tuple(devices))
            for queue, devices in split_devices(quota_file, self.devices).items()
        ]

    def launch(self, *, job_id: int, host: str, workload: ExecuteTask, env: dict[str, str], session: Session) -> str:
        env = {**env, "QUOTA_PREEMPT_FILE": str(self.preempt_file(job_id))}
        return f"{job_id}:{self.fork(job_id, workload, env)}"

    def status(self, handles: Mapping[str, int], *, session: Session) -> dict[str, Status]:
        self.reap()
        out = {}
        for handle in handles:
            job_id, pid = _parse(handle)
            if not self.alive(job_id, pid):
                out[handle] = Status(Liveness.ENDED, self.exit_info(job_id, pid).rc)
            elif self.task_exited(pid):
                out[handle] = Status(Liveness.TASK_EXITED)
            else:
                out[handle] = Status(Liveness.RUNNING)
        return out

    def notify(self, handle: str, notice: dict, *, session: Session) -> None:
        self.write_preempt_notice(_parse(handle)[0], notice)

    def kill(self, handle: str, *, session: Session) -> None:
        kill_tree(_parse(handle)[1])

    def forget(self, handle: str, *, session: Session) -> None:
        self.forget_pid(_parse(handle)[1])

    # -- processes ----------------------------------------------------------------------------

    def fork(self, job_id: int, workload: ExecuteTask, env: dict[str, str]) -> int:
        """Fork a child that runs the Airflow task supervisor for ``workload`` with ``env`` set."""
        job_dir = self.job_dir(job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        for path in (job_dir / PID_FILE, job_dir / PREEMPT_FILE, *job_dir.glob(EXIT_FILE.format(pid="*"))):
            path.unlink(missing_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        # Like LocalExecutor: freeze the GC across the fork so that the child's collections do not
        # touch (and copy) every page of the scheduler's heap.
        gc.freeze()
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                _child_main(workload, job_dir, env)
        finally:
            gc.unfreeze()
        self._children[pid] = -1
        (job_dir / PID_FILE).write_text(json.dumps({"pid": pid, "start": _proc_start_time(pid)}))
        return pid

    def reap(self) -> None:
        """Collect exit statuses of our own children so that they do not linger as zombies."""
        for pid in list(self._lingering):
            try:
                if os.waitpid(pid, os.WNOHANG)[0]:
                    self._lingering.discard(pid)
            except ChildProcessError:
                self._lingering.discard(pid)
        for pid, status in list(self._children.items()):
            if status != -1:
                continue
            try:
                done, code = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                self._children[pid] = 255
                continue
            if done:
                self._children[pid] = os.waitstatus_to_exitcode(code)

    def alive(self, job_id: int, pid: int | None) -> bool:
        """Whether the job's process still runs (our child or one adopted from a dead scheduler)."""
        if pid is None:
            return False
        if pid in self._children:
            return self._children[pid] == -1
        try:
            recorded = json.loads((self.job_dir(job_id) / PID_FILE).read_text())
        except (OSError, ValueError):
            recorded = {}
        start = _proc_start_time(pid)
        if start is None:
            return False
        # Same pid, different process start time: the pid was reused, the task is gone.
        return recorded.get("start") in (None, start)

    def task_exited(self, pid: int) -> bool:
        """Whether the supervisor ``pid`` has no live descendant: its task and everything the task
        started have exited (or the task has not started yet: the caller tells the two apart by the
        task instance's state). A subreaper, the supervisor adopts what its task leaves behind.

        False where the kernel does not list children (``/proc/PID/task/PID/children``).
        """
        children = _children(pid)
        if children is None:
            return False
        return all(_stat_field(child, 0) in (None, "Z") for child in children)  # a zombie has exited

    def exit_info(self, job_id: int, pid: int) -> ExitInfo:
        path = self.job_dir(job_id) / EXIT_FILE.format(pid=pid)
        try:
            return ExitInfo(rc=int(json.loads(path.read_text())["rc"]))
        except (OSError, ValueError, KeyError):
            return ExitInfo(rc=None)

    def forget_pid(self, pid: int | None) -> None:
        """Stop tracking ``pid``; one of our children that still runs is reaped when it exits."""
        if pid is not None and self._children.pop(pid, None) == -1:
            self._lingering.add(pid)

    def write_preempt_notice(self, job_id: int, notice: dict) -> Path:
        path = self.preempt_file(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(notice))
        os.replace(tmp, path)
        return path


def _parse(handle: str) -> tuple[int, int]:
    job_id, pid = handle.split(":")
    return int(job_id), int(pid)


def kill_tree(pid: int | None) -> None:
    """SIGKILL the process ``pid`` and every descendant (the task runs in a process group of its
    own, and what it starts may be in sessions of their own), children first."""
    if pid is None:
        return
    tree, index = [pid], 0
    while index < len(tree):  # collected before any is killed: orphans would leave the tree
        tree.extend(int(child) for child in _children(tree[index]) or ())
        index += 1
    for member in reversed(tree):
        try:
            os.kill(member, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _children(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return f.read().split()
    except OSError:
        return None


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it rather than to init (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: task_exited then sees only the task itself


def _child_main(workload: ExecuteTask, job_dir: Path, env: dict[str, str]) -> None:  # pragma: no cover
    rc = 1
    try:
        os.setsid()
        become_subreaper()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        try:
            from airflow import settings

            if settings.engine is not None:
                settings.engine.dispose(close=False)
        except Exception:
            pass
        os.environ.update(env)
        from airflow.executors.base_executor import BaseExecutor

        rc = BaseExecutor.run_workload(
            workload,
            subprocess_logs_to_stdout=True,
            proctitle=f"airflow worker -- QuotaExecutor: {workload.display_name}",
        )
        rc = int(rc or 0)
    except BaseException:
        logging.getLogger(__name__).exception("Task supervisor failed")
        rc = 1
    finally:
        try:
            (job_dir / EXIT_FILE.format(pid=os.getpid())).write_text(json.dumps({"rc": rc}))
        finally:
            os._exit(rc if 0 <= rc < 256 else 1)
