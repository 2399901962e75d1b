"""Local GPU launcher: the device inventory, and one forked process per admitted task.

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
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow.executors.workloads import ExecuteTask

log = logging.getLogger(__name__)

PID_FILE = "pid"
EXIT_FILE = "exit-{pid}"  # one per launch: a supervisor still finishing never writes a newer launch's
PREEMPT_FILE = "preempt.json"
PR_SET_CHILD_SUBREAPER = 36


def discover_devices(devices: str, virtual_gpus: int) -> tuple[list[str], str]:
    """The GPU indexes to hand out and where they came from.

    ``[quota] devices`` (comma-separated indexes) wins; else ``nvidia-smi``; else ``virtual_gpus``
    virtual indexes ``0..N-1`` so that quotas work on a laptop.
    """
    listed = [d.strip() for d in (devices or "").split(",") if d.strip()]
    if listed:
        if len(set(listed)) != len(listed):
            raise ValueError(f"[quota] devices: {devices!r} lists a device twice")
        return listed, "[quota] devices"
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run(
                [smi, "--query-gpu=index", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
                check=True,
            ).stdout
            found = [line.strip() for line in out.splitlines() if line.strip()]
            if found:
                return found, "nvidia-smi"
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("nvidia-smi failed (%s); using [quota] virtual_gpus", e)
    if virtual_gpus < 0:
        raise ValueError(f"[quota] virtual_gpus: {virtual_gpus} is negative")
    return [str(i) for i in range(virtual_gpus)], "[quota] virtual_gpus"


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
    """Starts, watches and kills task processes on this machine."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self._children: dict[int, int] = {}
        """pid -> exit status for processes this scheduler forked (reaped with waitpid)."""
        self._lingering: set[int] = set()
        """Forgotten children still finishing (see :meth:`task_exited`); reaped when they exit."""

    def job_dir(self, job_id: int) -> Path:
        return self.state_dir / "jobs" / str(job_id)

    def preempt_file(self, job_id: int) -> Path:
        return self.job_dir(job_id) / PREEMPT_FILE

    def launch(self, job_id: int, workload: ExecuteTask, env: dict[str, str]) -> int:
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

    def forget(self, pid: int | None) -> None:
        """Stop tracking ``pid``; one of our children that still runs is reaped when it exits."""
        if pid is not None and self._children.pop(pid, None) == -1:
            self._lingering.add(pid)

    def kill(self, pid: int | None) -> None:
        """SIGKILL the supervisor ``pid`` and every descendant (the task runs in a process group of
        its own, and what it starts may be in sessions of their own), children first."""
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

    def write_preempt_notice(self, job_id: int, notice: dict) -> Path:
        path = self.preempt_file(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(notice))
        os.replace(tmp, path)
        return path


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
