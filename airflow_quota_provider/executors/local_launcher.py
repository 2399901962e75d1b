"""Local GPU launcher: one forked process per admitted task, on the scheduler's own machine.

Each launch runs in its own session (``setsid``) so that it outlives a scheduler that dies: a
restarted scheduler re-adopts it from the job's files. The forked child is the launch's *guard*
(:mod:`.containment`); it forks the Airflow task supervisor, and the task runs in the supervisor's
own child process. The launcher writes ``pid`` (the guard's) when it forks, the guard writes
``supervisor-PID`` once it has forked the supervisor and ``exit-PID`` (the supervisor's exit code,
null when it was killed) once nothing of the launch is left; a guard that vanishes without its exit
file was killed.

The supervisor may notice its task child's exit up to ``[workers] min_heartbeat_interval``
(5 s) late: when the task's sockets reach EOF a moment before the kernel reports its exit, it
sleeps a full heartbeat interval before looking again. :meth:`LocalLauncher.task_exited` sees the
exit at once, so that the GPUs are not held idle meanwhile, and counts a task process that released
its GPUs once its command was gone (:func:`~airflow_quota_provider.protocol.release_gpus`) as
exited while it ends its try.

Every process a job starts is contained (:mod:`.containment`): the guard enters a cgroup of its
own where the kernel allows it (``[quota] process_cgroups``); guard and supervisor are child
subreapers in any case, so that processes the task started (a training command in a session of its
own, say) stay their descendants after the task, or even the supervisor, was gone. When the task is
done the supervisor ends what is left (SIGTERM, then SIGKILL), and the guard again once the
supervisor is gone, before it exits; the launcher reports a launch as running while anything of it
lives (its cgroup is populated, or its guard runs): the GPUs are free only when all are gone. The
exit file is written atomically, and the guard's exit status stands in for it when the job
directory was deleted under a running task. A launch started ``tied_to_parent`` (a GPU host's) ends
with the process that started it (:func:`.containment.watch_parent`).
"""

from __future__ import annotations

import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from airflow_quota_provider.executors.containment import (
    JobCgroup,
    become_subreaper,
    children as _children,
    die_with_parent,
    end_descendants,
    kill_tree,
    process_alive,
    remove_empty_cgroups,
    reap_children,
    stat_field as _stat_field,
    watch_parent,
)
from airflow_quota_provider.executors.gangs import LOCAL_ADDRESS, run_member, with_master_port
from airflow_quota_provider.executors.launcher import HostDevices, Launch, Liveness, Status
from airflow_quota_provider.models.host import launch_key
from airflow_quota_provider.protocol import (
    ENV_PREEMPT_FILE, PREEMPT_FILE, RELEASED_FILE, PreemptionNotice, released_by, write_atomically, write_notice,
)

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow.executors.workloads import ExecuteTask
    from airflow_quota_provider.policy import QuotaFile

log = logging.getLogger(__name__)

PID_FILE = "pid"
PORT_FILE = "master-port"
"""A gang's node 0: the ``MASTER_PORT`` chosen for it when it was launched."""
MEMBER_LOG = "member.log"
"""A gang member's command output."""
EXIT_FILE = "exit-{pid}"  # one per launch: a guard still finishing never writes a newer launch's
SUPERVISOR_FILE = "supervisor-{pid}"
LEFTOVER_WAIT_S = 60.0
"""How long :meth:`LocalLauncher.end_leftovers` waits for killed launches to be gone."""
UNKNOWN = -2
"""Exit status of a child whose status could not be collected."""


@dataclass(frozen=True)
class ExitInfo:
    """How a task process ended: ``rc`` from the supervisor, or None when it was killed."""

    rc: int | None


def _proc_start_time(pid: int) -> str | None:
    return _stat_field(pid, 19)


class LocalLauncher:
    """Starts, watches and kills task processes on this machine: one implicit host, ``local``,
    whose devices the job queues of the quota file share in file order (every node of a gang runs
    here). A handle is ``KEY:PID``, the key naming the launch's job directory: the job id, and for
    node N > 0 of a gang ``JOB-N``."""

    places_on_hosts = False
    HOST = "local"

    def __init__(
        self, state_dir: Path, devices: list[str] | None = None, *, gpu_type: str | None = None, cgroups: bool | None = None
    ) -> None:
        """``gpu_type``: the type of this machine's GPUs (``[quota] gpu_type``); ``cgroups``: contain
        each launch in a cgroup v2 where the kernel allows it; None reads ``[quota] process_cgroups``
        (``auto``, the default, or ``off``: the subreaper alone)."""
        self.state_dir = state_dir
        self.devices = list(devices or [])
        self.gpu_type = gpu_type
        if cgroups is None:
            from airflow.configuration import conf

            cgroups = conf.get("quota", "process_cgroups", fallback="auto").strip().lower() != "off"
        self.use_cgroups = cgroups
        if cgroups:
            remove_empty_cgroups()
        self._task_seen: set[int] = set()
        """Supervisors this launcher has seen with a live task process."""
        self._children: dict[int, int] = {}
        """pid -> exit status for processes this scheduler forked (reaped with waitpid): -1 while
        it runs, :data:`UNKNOWN` when it could not be collected."""
        self._cgroups: dict[int, JobCgroup] = {}
        """pid -> the cgroup of a launch this scheduler made (adopted launches: from the pid file)."""
        self._empty_later: list[JobCgroup] = []
        """Cgroups of forgotten launches whose supervisor was still finishing: removed once empty."""
        self._lingering: set[int] = set()
        """Forgotten children still finishing (see :meth:`task_exited`); reaped when they exit."""
        self._supervisors: dict[int, int] = {}
        """Guard pid -> the pid of the task supervisor it forked."""

    def job_dir(self, job_id: int | str) -> Path:
        return self.state_dir / "jobs" / str(job_id)

    def preempt_file(self, job_id: int | str) -> Path:
        return self.job_dir(job_id) / PREEMPT_FILE

    # -- the Launcher protocol ---------------------------------------------------------------

    def hosts(self, quota_file: QuotaFile, *, session: Session) -> list[HostDevices]:
        from airflow_quota_provider.executors.config import split_devices

        return [
            HostDevices(self.HOST, queue, tuple(devices), gpu_type=self.gpu_type)
            for queue, devices in split_devices(quota_file, self.devices, gpu_type=self.gpu_type).items()
        ]

    def launch_all(self, launches: Sequence[Launch], *, session: Session) -> list[str | Exception]:
        out: list[str | Exception] = []
        for launch in launches:
            try:
                out.append(self._launch(launch))
            except Exception as e:
                out.append(e)
        return out

    def _launch(self, launch: Launch) -> str:
        env, port = with_master_port(launch.env)
        (self.job_dir(launch.job_id) / PORT_FILE).unlink(missing_ok=True)
        handle = f"{launch.job_id}:{self.fork(launch.job_id, launch.workload, env)}"
        if port is not None:
            write_atomically(self.job_dir(launch.job_id) / PORT_FILE, str(port))
        return handle

    def launch_member(
        self, *, job_id: int, node_rank: int, host: str, argv: list[str], cwd: str | None, env: dict[str, str], session: Session
    ) -> str:
        key = launch_key(job_id, node_rank)
        log_file = self.job_dir(key) / MEMBER_LOG
        return f"{key}:{self.start(key, lambda: run_member(argv, cwd, log_file), env)}"

    def gang_port(self, handle: str, *, session: Session) -> int | None:
        try:
            return int((self.job_dir(_parse(handle)[0]) / PORT_FILE).read_text())
        except (OSError, ValueError):
            return None

    def address(self, host: str, *, session: Session) -> str:
        return LOCAL_ADDRESS

    def recorded_launch(self, job_id: int, *, since: float, session: Session) -> str | None:
        """Never: a fork is recorded only by the job row (a scheduler that dies between its admission
        commit and that row leaves the process unknown; its GPUs are handed out again)."""
        return None

    def status(self, handles: Mapping[str, int], *, session: Session) -> dict[str, Status]:
        self.reap()
        out = {}
        for handle in handles:
            job_id, pid = _parse(handle)
            cgroup = self.cgroup(job_id, pid)
            if not self.alive(job_id, pid):
                if cgroup is not None and cgroup.populated():
                    # The supervisor was killed and something of the job lives on: end it, and
                    # hold the devices until it is gone.
                    cgroup.kill()
                    out[handle] = Status(Liveness.RUNNING)
                    continue
                if cgroup is not None:
                    cgroup.remove()
                out[handle] = Status(Liveness.ENDED, self.exit_info(job_id, pid).rc)
            elif (supervisor := self.supervisor(job_id, pid)) is None:
                out[handle] = Status(Liveness.RUNNING)  # the guard has not forked it yet
            elif not self.task_exited(supervisor, job_id):
                self._task_seen.add(pid)
                out[handle] = Status(Liveness.RUNNING)
            else:
                # Gone once seen: the task ran and ended. Never seen: not started yet (or too brief
                # to see), so wait for the supervisor's exit.
                out[handle] = Status(Liveness.TASK_EXITED if pid in self._task_seen else Liveness.RUNNING)
        return out

    def notify(self, handle: str, notice: dict, *, session: Session) -> None:
        self.write_preempt_notice(_parse(handle)[0], notice)

    def kill(self, handle: str, *, session: Session) -> None:
        self.kill_job(*_parse(handle))

    def forget(self, handle: str, *, session: Session) -> None:
        job_id, pid = _parse(handle)
        cgroup = self._cgroups.pop(pid, None)
        if cgroup is not None and not cgroup.remove():
            self._empty_later.append(cgroup)  # its supervisor is still finishing
        self.forget_pid(pid)

    # -- processes ----------------------------------------------------------------------------

    def fork(self, job_id: int, workload: ExecuteTask, env: dict[str, str]) -> int:
        """Fork a child that runs the Airflow task supervisor for ``workload`` with ``env`` set."""
        return self.start(job_id, lambda: supervise_workload(workload), env)

    def start(self, job_id: int | str, run: Callable[[], int], env: dict[str, str], *, tied_to_parent: bool = False) -> int:
        """Fork a contained guard that forks a child calling ``run`` (the task supervisor) with
        ``env`` and ``QUOTA_PREEMPT_FILE`` set, ends what is left behind, and records ``run``'s exit
        code; returns the guard's pid. ``tied_to_parent``: the whole launch is killed when this
        process dies."""
        job_dir = self.job_dir(job_id)
        job_dir.mkdir(parents=True, exist_ok=True)
        for path in (job_dir / PID_FILE, job_dir / PREEMPT_FILE, job_dir / RELEASED_FILE, *job_dir.glob(EXIT_FILE.format(pid="*"))):
            path.unlink(missing_ok=True)
        env = {**env, ENV_PREEMPT_FILE: str(self.preempt_file(job_id))}
        cgroup = JobCgroup.create(f"job-{job_id}-{time.time_ns()}") if self.use_cgroups else None
        warm_task_client()  # once per process: every later launch forks it ready
        sys.stdout.flush()
        sys.stderr.flush()
        # Like LocalExecutor: freeze the GC across the fork so that the child's collections do not
        # touch (and copy) every page of the scheduler's heap.
        gc.freeze()
        me = os.getpid()
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                _guard_main(run, job_dir, env, cgroup, parent=me if tied_to_parent else None)
        finally:
            gc.unfreeze()
        self._children[pid] = -1
        if cgroup is not None:
            cgroup.add(pid)  # the child adds itself too, first thing: whichever is first, it is in before it starts anything
            self._cgroups[pid] = cgroup
        recorded = {"pid": pid, "start": _proc_start_time(pid), "cgroup": str(cgroup.path) if cgroup is not None else None}
        write_atomically(job_dir / PID_FILE, json.dumps(recorded))
        return pid

    def cgroup(self, job_id: int | str, pid: int) -> JobCgroup | None:
        """The cgroup of the launch ``pid`` of ``job_id``, if it has one (adopted: from the pid file)."""
        if pid in self._cgroups or pid in self._children:
            return self._cgroups.get(pid)
        try:
            recorded = json.loads((self.job_dir(job_id) / PID_FILE).read_text())
        except (OSError, ValueError):
            return None
        if recorded.get("pid") != pid or not recorded.get("cgroup"):
            return None
        self._cgroups[pid] = JobCgroup(Path(recorded["cgroup"]))
        return self._cgroups[pid]

    def supervisor(self, job_id: int | str, pid: int) -> int | None:
        """The task supervisor that the guard ``pid`` forked, once it has."""
        if pid not in self._supervisors:
            try:
                self._supervisors[pid] = int((self.job_dir(job_id) / SUPERVISOR_FILE.format(pid=pid)).read_text())
            except (OSError, ValueError):
                return None
        return self._supervisors[pid]

    def running(self, job_id: int | str) -> bool:
        """Whether anything of the launch last recorded for ``job_id`` lives: its guard (the same
        process: pid and start time), or a process in its cgroup."""
        try:
            recorded = json.loads((self.job_dir(job_id) / PID_FILE).read_text())
        except (OSError, ValueError):
            return False
        if recorded.get("cgroup") and JobCgroup(Path(recorded["cgroup"])).populated():
            return True
        pid = recorded.get("pid")
        return process_alive(pid) and _proc_start_time(pid) == recorded.get("start")

    def end_leftovers(self, *, timeout_s: float = LEFTOVER_WAIT_S) -> list[str]:
        """Kill every launch recorded in this launcher's job directories that still lives, and
        return their keys (job ids; ``JOB-N`` for a gang's node N) once none lives (a GPU host's proof, before its GPUs are handed out
        again, that none of the launches the scheduler gave up still runs). Raises TimeoutError
        naming the jobs when they are not gone within ``timeout_s``."""
        left = [path.parent.name for path in (self.state_dir / "jobs").glob(f"*/{PID_FILE}") if self.running(path.parent.name)]
        for job_id in left:
            recorded = json.loads((self.job_dir(job_id) / PID_FILE).read_text())
            log.warning("Launch of job %s (guard pid %s) still runs: ending it", job_id, recorded["pid"])
            self.kill_job(job_id, int(recorded["pid"]))
        deadline = time.monotonic() + timeout_s
        while alive := [job_id for job_id in left if self.running(job_id)]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"launches {', '.join(alive)} still run {timeout_s:g} s after SIGKILL")
            self.reap()
            reap_children()
            time.sleep(0.05)
        return left

    def kill_job(self, job_id: int | str, pid: int) -> None:
        """SIGKILL everything the launch started: its whole cgroup, or its stopped process tree."""
        cgroup = self.cgroup(job_id, pid)
        if cgroup is not None:
            cgroup.kill()
        kill_tree(pid)

    def reap(self) -> None:
        """Collect exit statuses of our own children so that they do not linger as zombies, and
        remove the cgroups of forgotten launches that have emptied."""
        self._empty_later = [cgroup for cgroup in self._empty_later if not cgroup.remove()]
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
                self._children[pid] = UNKNOWN
                continue
            if done:
                self._children[pid] = os.waitstatus_to_exitcode(code)

    def alive(self, job_id: int | str, pid: int | None) -> bool:
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

    def task_exited(self, pid: int, job_id: int | str | None = None) -> bool:
        """Whether the supervisor ``pid`` has no live descendant: its task and everything the task
        started have exited (or the task has not started yet: the caller tells the two apart by the
        task instance's state). A subreaper, the supervisor adopts what its task leaves behind.
        With ``job_id``, also when the one that lives is the task process that released its GPUs in
        the job's directory (:func:`~airflow_quota_provider.protocol.release_gpus`), with no child.

        False where the kernel does not list children (``/proc/PID/task/PID/children``).
        """
        children = _children(pid)
        if children is None:
            return False
        live = [int(child) for child in children if process_alive(child)]
        if not live:
            return True
        if len(live) > 1 or job_id is None or released_by(self.job_dir(job_id)) != live[0]:
            return False
        left = _children(live[0])  # a child it started since still counts
        return left is not None and not any(process_alive(child) for child in left)

    def exit_info(self, job_id: int | str, pid: int) -> ExitInfo:
        """The supervisor's exit code from its exit file, or, for a child of this scheduler whose
        file is missing (its job directory was deleted), from its exit status; None when killed."""
        path = self.job_dir(job_id) / EXIT_FILE.format(pid=pid)
        try:
            rc = json.loads(path.read_text())["rc"]
            return ExitInfo(rc=None if rc is None else int(rc))
        except (OSError, ValueError, KeyError, TypeError):
            pass
        status = self._children.get(pid, UNKNOWN)
        return ExitInfo(rc=status if status >= 0 else None)  # negative: killed by a signal

    def forget_pid(self, pid: int | None) -> None:
        """Stop tracking ``pid``; one of our children that still runs is reaped when it exits."""
        self._task_seen.discard(pid)
        self._supervisors.pop(pid, None)
        if pid is not None and self._children.pop(pid, None) == -1:
            self._lingering.add(pid)

    def write_preempt_notice(self, job_id: int | str, notice: dict) -> Path:
        """Deliver ``notice`` (:meth:`PreemptionNotice.to_dict`, as the launcher seam carries it)."""
        path = self.preempt_file(job_id)
        write_notice(path, PreemptionNotice.from_dict(notice))
        return path


def _parse(handle: str) -> tuple[str, int]:
    key, pid = handle.split(":")
    return key, int(pid)


def warm_task_client() -> None:
    """Build, in the process that forks the launches, what each task supervisor would otherwise
    build for itself: the execution API client's TLS context. Airflow caches it per process, and
    loading certifi's authorities costs some 45 ms of CPU, on the path of every start (an owner
    taking its GPUs back waits on it)."""
    try:
        from airflow.sdk.api import client
    except ImportError:  # pragma: no cover - Airflow without the task SDK
        return
    cached = getattr(client.Client, "_get_ssl_context_cached", None)
    if cached is not None:  # private in Airflow: without it, each supervisor builds its own
        cached(getattr(client, "API_SSL_CA_FILE_PATH", None), getattr(client, "API_SSL_CERT_PATH", None))


def supervise_workload(workload: ExecuteTask) -> int:  # pragma: no cover - runs in the child
    from airflow.executors.base_executor import BaseExecutor

    rc = BaseExecutor.run_workload(
        workload,
        # The task's log goes to its log file (the UI shows it); echoed to stdout it would fill the
        # scheduler's console with every task's lines.
        subprocess_logs_to_stdout=False,
        proctitle=f"airflow worker -- QuotaExecutor: {workload.display_name}",
    )
    return int(rc or 0)


def _guard_main(  # pragma: no cover - runs in the forked guard
    run: Callable[[], int], job_dir: Path, env: dict[str, str], cgroup: JobCgroup | None, *, parent: int | None
) -> None:
    """The launch's guard: forks the supervisor, outlives it, ends what it left, records its exit."""
    rc = None
    try:
        if cgroup is not None:
            cgroup.add(os.getpid())  # before anything is started: every descendant inherits it
        os.setsid()  # out of the launcher's process group: a signal to that group does not reach it
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
        if parent is not None:
            watch_parent(parent, lambda: _end_now(cgroup))
        supervisor = os.fork()
        if supervisor == 0:
            _supervisor_main(run)
        try:
            write_atomically(job_dir / SUPERVISOR_FILE.format(pid=os.getpid()), str(supervisor))
        except OSError:  # the job directory deleted under the task meanwhile: only the early exit notice is lost
            logging.getLogger(__name__).warning("Could not record the supervisor of %s", job_dir, exc_info=True)
        rc = os.waitstatus_to_exitcode(os.waitpid(supervisor, 0)[1])
        rc = rc if rc >= 0 else None  # killed by a signal
    except BaseException:
        logging.getLogger(__name__).exception("Task guard failed")
    finally:
        try:
            end_descendants()  # what a killed supervisor left is ours now: nothing outlives the guard
        except BaseException:
            logging.getLogger(__name__).exception("Could not end what the task left behind")
        try:
            write_atomically(job_dir / EXIT_FILE.format(pid=os.getpid()), json.dumps({"rc": rc}))
        finally:
            os._exit(rc if rc is not None and 0 <= rc < 256 else 1)


def _supervisor_main(run: Callable[[], int]) -> None:  # pragma: no cover - runs in the forked supervisor
    rc = 1
    try:
        die_with_parent()  # a killed guard takes the supervisor with it
        become_subreaper()
        rc = run()
    except BaseException:
        logging.getLogger(__name__).exception("Task supervisor failed")
        rc = 1
    finally:
        try:
            end_descendants()  # nothing the task started outlives this process
        except BaseException:
            logging.getLogger(__name__).exception("Could not end what the task left behind")
        finally:
            os._exit(rc if 0 <= rc < 256 else 1)


def _end_now(cgroup: JobCgroup | None) -> None:  # pragma: no cover - runs in the guard
    """The process that started the launch is gone: kill all of it at once, guard included."""
    if cgroup is not None:
        cgroup.kill()
    kill_tree(os.getpid(), include_root=False)
    os._exit(1)
