"""Every process a job starts ends with the job, and the job's GPUs are free only once all are gone.

A task's command may start processes in sessions of their own (``setsid``) that ignore SIGTERM; a
signal to the task's process group does not reach them, and once their parents are gone they are
re-parented away from the task. The launchers keep hold of them in layers, each covering what the
one before cannot:

- **A guard per launch.** The launcher forks a small *guard* (in a session of its own, a child
  subreaper), and the guard forks the Airflow task supervisor (a subreaper too, and dead with its
  guard: ``PR_SET_PDEATHSIG``). Whatever the task leaves behind is re-parented to the supervisor,
  or, once the supervisor itself was killed (say by the OOM killer), to the guard, never to init.
  The guard ends what is left (:func:`end_descendants`: SIGTERM, a grace period, SIGKILL) before it
  exits, so the guard's exit means the whole launch is gone: the GPUs are held until then.
- **A cgroup v2 per launch** (:class:`JobCgroup`), where the kernel lets this process create one
  below its own cgroup (root, or a delegated subtree): the guard enters it before it starts
  anything, every descendant inherits it and none can leave it unprivileged. The cgroup says
  whether anything of the job still lives (``cgroup.events``: ``populated``) even after the guard
  was killed, and ``cgroup.kill`` ends all of it at once.
- **Tied to the GPU host** (the Celery launcher): the guard watches its parent, the worker's pool
  process (:func:`watch_parent`: a pidfd, polling where there is none). The guard is outside the
  worker's process group, so a ``kill -9 -PGID`` of the worker, a crash or the OOM killer take the
  worker and its pool processes (Celery gives those ``PR_SET_PDEATHSIG``), and the guard, the one
  survivor, kills its cgroup or its stopped tree and exits: nothing of a launch outlives its
  worker. A pidfd, unlike ``PR_SET_PDEATHSIG`` on the task's processes, is neither fired by the
  exit of the thread that forked nor lost across ``exec`` of a set-user-ID program, and reaches
  grandchildren that ``PR_SET_PDEATHSIG`` (direct children only) cannot.
- **Proof before a host's GPUs return**: a host whose worker starts again, or that was lost and
  heartbeats again, first ends every launch recorded in its job directories (the guard's pid and
  start time, its cgroup) and waits until none lives (:meth:`LocalLauncher.end_leftovers`); only
  then is it active again. A guard SIGKILLed without a cgroup loses its tree to init: that is what
  the cgroup is for.

The process tree is read from every thread's ``children`` list: a child forked by a thread other
than the main one is listed under that thread only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PARENT_POLL_S = 0.2
"""How often a guard without a pidfd looks whether its parent is still there."""
LEFTOVER_GRACE_S = 5.0
"""What a process the task left behind gets between SIGTERM and SIGKILL once the task is done (as
Airflow's supervisor gives its task)."""
CGROUP_DIR = "airflow-quota-jobs"
"""The cgroup, below this process's own, that holds one cgroup per launch."""


# -- the process tree (/proc) --------------------------------------------------------------------


def stat_field(pid: int | str, index: int) -> str | None:
    """Field ``index`` after the command name of ``/proc/PID/stat`` (0: state, 19: start time), or
    None when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[index]
    except (OSError, IndexError):
        return None


def children(pid: int | str) -> list[str] | None:
    """The pids of ``pid``'s children, whichever of its threads forked them (each thread lists its
    own); None where the kernel does not list them."""
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    found, listed = [], False
    for thread in threads:
        try:
            with open(f"/proc/{pid}/task/{thread}/children") as f:
                found.extend(f.read().split())
            listed = True
        except OSError:
            continue  # the thread has just exited
    return found if listed else None


def descendants(pid: int) -> list[int]:
    """Every descendant of ``pid``, parents before their children."""
    tree, index = [pid], 0
    while index < len(tree):
        tree.extend(int(child) for child in children(tree[index]) or ())
        index += 1
    return tree[1:]


def process_alive(pid: int | str) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (a zombie has exited)."""
    return stat_field(pid, 0) not in (None, "Z")


def _live(pids: list[int]) -> list[int]:
    return [pid for pid in pids if process_alive(pid)]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def kill_tree(pid: int | None, *, include_root: bool = True) -> None:
    """SIGKILL ``pid`` (unless ``include_root`` is False) and every descendant.

    The tree is stopped (SIGSTOP) until no new member appears, then killed: a process cannot fork
    away, or be re-parented out of the tree, between the moment it is seen and the moment it dies.
    """
    if pid is None:
        return
    seen: list[int] = []
    for _ in range(100):  # each round stops what the previous one missed; forks cannot outrun it
        tree = ([pid] if include_root else []) + descendants(pid)
        new = [member for member in tree if member not in seen]
        if not new:
            break
        _signal(new, signal.SIGSTOP)
        seen.extend(new)
    _signal(list(reversed(seen)), signal.SIGKILL)


def become_subreaper() -> None:
    """Orphaned descendants of this process are re-parented to it rather than to init (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the process tree is then only what /proc still links to this process


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``, Linux); exits at once if the
    parent is already gone. For a process forked by its parent's main thread: the signal fires when
    the forking *thread* exits."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        os._exit(1)


def watch_parent(parent: int, on_death: Callable[[], None]) -> None:
    """Call ``on_death`` in a thread of its own once this process's parent ``parent`` has exited."""

    def watch() -> None:
        try:
            fd = os.pidfd_open(parent)
        except (OSError, AttributeError):
            fd = None  # gone already, or Linux < 5.3: poll below
        if fd is not None and os.getppid() == parent:  # still ours: the pidfd is not a reused pid's
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll():
                pass
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        on_death()

    threading.Thread(target=watch, name="quota-watch-parent", daemon=True).start()


def wait_for_an_exit(pids: list[int], timeout_s: float) -> None:
    """Return once one of ``pids`` has exited, or after ``timeout_s``: a pidfd is readable from the
    moment its process exits, so the caller sees the exit then, not on its next poll. Returns at
    once when one is gone already; waits the whole ``timeout_s`` where there are no pidfds."""
    fds: list[int] = []
    try:
        for pid in pids:
            try:
                fds.append(os.pidfd_open(pid))
            except ProcessLookupError:
                return
            except (OSError, AttributeError):
                continue  # Linux < 5.3: the timeout is the poll
        if fds:
            select.select(fds, [], [], timeout_s)
        else:
            time.sleep(timeout_s)
    finally:
        for fd in fds:
            os.close(fd)


def reap_children() -> None:
    """Collect every exited child of this process (a subreaper inherits orphans to reap)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


def end_descendants(grace_s: float = LEFTOVER_GRACE_S) -> None:
    """End every descendant of this process (a subreaper whose task is done): SIGTERM, up to
    ``grace_s`` to exit, then SIGKILL; returns once none is left."""
    me = os.getpid()
    left = _live(descendants(me))
    if not left:
        reap_children()
        return
    log.warning("The task left %d process(es) behind (%s): ending them", len(left), ", ".join(map(str, left)))
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _live(descendants(me)) and time.monotonic() < deadline:
        reap_children()
        time.sleep(0.05)
    while _live(descendants(me)):
        kill_tree(me, include_root=False)
        reap_children()
        time.sleep(0.01)
    reap_children()


# -- cgroup v2 ------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def _cgroup_base() -> Path | None:
    """This process's own cgroup v2 directory, or None without a cgroup v2 hierarchy."""
    mount = None
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    mount = left.split()[4]
                    break
        with open("/proc/self/cgroup") as f:
            own = next((line.strip()[3:] for line in f if line.startswith("0::")), None)
    except OSError:
        return None
    if mount is None or own is None:
        return None
    return Path(mount + own.rstrip("/")) if own != "/" else Path(mount)


def remove_empty_cgroups(older_than_s: float = 300.0) -> int:
    """Remove empty launch cgroups made more than ``older_than_s`` ago (a scheduler that stopped
    before it could remove its last ones); returns how many. Young ones are left alone: another
    scheduler on this machine may just have made one for a launch that is starting."""
    base = _cgroup_base()
    if base is None or not (base / CGROUP_DIR).is_dir():
        return 0
    removed, now = 0, time.time()
    for path in (base / CGROUP_DIR).glob("job-*"):
        try:
            if now - path.stat().st_mtime > older_than_s and not JobCgroup(path).populated():
                removed += JobCgroup(path).remove()
        except OSError:
            continue
    return removed


class JobCgroup:
    """The cgroup v2 of one launch: ``<own cgroup>/airflow-quota-jobs/<name>``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def create(cls, name: str) -> JobCgroup | None:
        """A new empty cgroup, or None where the kernel does not let this process make one."""
        base = _cgroup_base()
        if base is None:
            return None
        path = base / CGROUP_DIR / name
        try:
            path.mkdir(parents=True, exist_ok=True)
            if not (path / "cgroup.procs").exists():
                raise OSError(errno.ENOENT, "not a cgroup")
        except OSError as e:
            log.info("No cgroup for task processes (%s: %s); their subreaper keeps them", path, e)
            return None
        return cls(path)

    def add(self, pid: int) -> bool:
        """Move ``pid`` into the cgroup; False when the kernel refuses."""
        try:
            (self.path / "cgroup.procs").write_text(str(pid))
            return True
        except OSError:
            return False

    def pids(self) -> list[int]:
        try:
            return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def populated(self) -> bool:
        """Whether a process of the job still lives in it (a zombie does not count: cgroup v2 reads
        populated 0 once only zombies are left, as measured on kernel 6.18)."""
        try:
            for line in (self.path / "cgroup.events").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "populated":
                    return value.strip() == "1"
        except OSError:
            pass
        return bool(self.pids())

    def kill(self) -> None:
        """SIGKILL every process in the cgroup at once (``cgroup.kill``, Linux 5.14); older kernels:
        freeze it, then kill each process."""
        try:
            (self.path / "cgroup.kill").write_text("1")
            return
        except OSError:
            pass
        frozen = False
        with contextlib.suppress(OSError):
            (self.path / "cgroup.freeze").write_text("1")
            frozen = True
        _signal(self.pids(), signal.SIGKILL)
        if frozen:
            with contextlib.suppress(OSError):
                (self.path / "cgroup.freeze").write_text("0")

    def remove(self) -> bool:
        """Delete the cgroup if it is empty; whether it is gone (it stays while anything lives in it)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True
