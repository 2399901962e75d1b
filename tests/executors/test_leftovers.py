"""What a GPU host proves before its GPUs are handed out again (issue 31, "a task never runs twice"):
:meth:`LocalLauncher.end_leftovers` kills every launch recorded in its job directories that still
lives and returns only once none does; a launch that outlives SIGKILL is named in a TimeoutError,
and the host is not proven free.

SIGKILL does not end every process at once: one stuck in its exit (a driver that does not let go of
its device, a debugger that holds it) takes no more signals. These tests use a debugger, which needs
no privilege: ``ptrace`` with ``PTRACE_O_TRACEEXIT`` holds the launch's guard in its exit, once its
task has ended, until the test lets go. It is held before anyone kills it: a SIGKILL that reached a
traced process in any other stop would end it without the exit stop. A zombie would not do: it has
exited, and counts as gone (``process_alive``; a cgroup v2 that holds only zombies is not
populated either).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from airflow_quota_provider.executors.local_launcher import LocalLauncher

JOB = 7

PTRACE_CONT = 7
PTRACE_SEIZE = 0x4206
PTRACE_O_TRACEEXIT = 0x40
PTRACE_EVENT_EXIT = 6

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, pid: int, data: int = 0) -> None:
    if _libc.ptrace(request, pid, None, data) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace: {os.strerror(err)}")


@contextlib.contextmanager
def held_launch(state_dir: Path, job_id: int) -> Iterator[Callable[[], None]]:
    """A real launch of ``job_id`` recorded in ``state_dir`` whose task has ended and whose guard a
    debugger holds in its exit; yields the function that lets it finish (called at the latest when
    the block ends). The debugger is the guard's parent, and reaps it once it lets go."""
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    debugger = os.fork()
    if debugger == 0:  # pragma: no cover - runs in the forked debugger
        code = 1
        try:
            os.close(ready_r)
            os.close(release_w)
            _debug(state_dir, job_id, ready=ready_w, release=release_r)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(release_r)

    def release() -> None:
        with contextlib.suppress(OSError):  # let go already
            os.close(release_w)

    try:
        with os.fdopen(ready_r) as ready:  # the launch holds this pipe too: a debugger that failed never closes it
            said = ready.readline().strip() if select.select([ready], [], [], 30)[0] else ""
        if said.startswith("no debugger"):
            pytest.skip(f"{said}: this machine does not let a process trace its child")
        if said != "held":
            pytest.fail("the debugger could not hold the launch (its traceback is in the captured stderr)")
        yield release
    finally:
        release()
        _wait_for_exit(debugger)


def _debug(state_dir: Path, job_id: int, *, ready: int, release: int) -> None:  # pragma: no cover
    """Start the launch and trace its guard; let its task end, and hold the guard in its exit
    until ``release`` closes. An exiting process takes no more signals: SIGKILL cannot hurry it."""
    launcher = LocalLauncher(state_dir, cgroups=False)
    traced = state_dir / f"traced-{job_id}"
    guard = launcher.start(job_id, lambda: _wait_for(traced), {})
    try:
        _ptrace(PTRACE_SEIZE, guard, PTRACE_O_TRACEEXIT)
    except OSError as e:
        traced.touch()
        os.waitpid(guard, 0)
        os.write(ready, f"no debugger ({e})\n".encode())
        return
    traced.touch()  # the task ends, and the guard after it
    while True:
        _, status = os.waitpid(guard, 0)
        if not os.WIFSTOPPED(status):
            return  # gone, and reaped
        event = status >> 16
        if event == PTRACE_EVENT_EXIT:
            os.write(ready, b"held\n")
            select.select([release], [], [])
        elif event:
            continue  # a group stop: it stays stopped, as without a debugger
        _ptrace(PTRACE_CONT, guard, 0 if event else os.WSTOPSIG(status))


def _wait_for(path: Path) -> int:  # pragma: no cover - the task, in the launch's supervisor
    while not path.exists():
        time.sleep(0.01)
    return 0


def _wait_for_exit(debugger: int, timeout_s: float = 30.0) -> None:
    """Reap the debugger, and fail the test if it failed: a debugger that let go early makes a
    launch die of SIGKILL after all."""
    deadline = time.monotonic() + timeout_s
    try:
        while not (status := os.waitpid(debugger, os.WNOHANG))[0]:
            if time.monotonic() > deadline:
                os.kill(debugger, signal.SIGKILL)
                os.waitpid(debugger, 0)
                pytest.fail(f"the debugger {debugger} did not exit")
            time.sleep(0.05)
    except ChildProcessError:
        return  # reaped already (end_leftovers reaps this process's children)
    if os.waitstatus_to_exitcode(status[1]) != 0:
        pytest.fail("the debugger failed (its traceback is in the captured stderr)")


def test_a_launch_that_outlives_sigkill_is_named_and_the_host_is_not_proven_free(tmp_path):
    """The error names the launches that still run after SIGKILL, not those that died of it."""
    earlier = LocalLauncher(tmp_path, cgroups=False)
    earlier.start(JOB + 1, lambda: time.sleep(600) or 0, {})
    with held_launch(tmp_path, JOB):
        restarted = LocalLauncher(tmp_path, cgroups=False)
        assert restarted.running(JOB) and restarted.running(JOB + 1)
        expected = f"launches {JOB} still run 0.5 s after SIGKILL"
        with pytest.raises(TimeoutError, match=re.escape(expected)):
            restarted.end_leftovers(timeout_s=0.5)
        assert restarted.running(JOB), "the launch named still runs"
        assert not restarted.running(JOB + 1), "the launch that died of SIGKILL is gone"
    earlier.reap()


def test_a_leftover_slow_to_die_is_waited_for_and_its_job_returned_once_gone(tmp_path):
    with held_launch(tmp_path, JOB) as release:
        restarted = LocalLauncher(tmp_path, cgroups=False)
        started = time.monotonic()
        threading.Timer(1.0, release).start()
        assert restarted.end_leftovers(timeout_s=30) == [str(JOB)]
        assert time.monotonic() - started >= 1.0, "it returned before the held launch was gone"
        assert not restarted.running(JOB)
