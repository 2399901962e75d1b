"""What a GPU host proves before its GPUs are handed out again (issue 31, "a task never runs twice"):
:meth:`LocalLauncher.end_leftovers` kills every launch recorded in its job directories that still
lives and returns only once none does; a launch that outlives SIGKILL is named in a TimeoutError,
and the host is not proven free.

SIGKILL does not end every process at once: one in uninterruptible sleep (a driver call that hangs)
or one that a debugger holds lives on. These tests use the second, which needs no privilege: a
debugger (``ptrace`` with ``PTRACE_O_TRACEEXIT``) stops the launch's guard at its exit, SIGKILLed,
until it lets go. A zombie would not do: it has exited, and counts as gone (``process_alive``; a
cgroup v2 that holds only zombies is not populated either).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import select
import signal
import time
import traceback
from collections.abc import Iterator
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
def held_launch(state_dir: Path, job_id: int, *, hold_s: float = 600.0) -> Iterator[int]:
    """A real launch of ``job_id`` recorded in ``state_dir`` (guard, supervisor, task) whose guard a
    debugger holds at its exit, once it is killed, for ``hold_s`` (or until the block ends); yields
    the guard's pid. The debugger is the guard's parent, and reaps it once it lets go."""
    ready_r, ready_w = os.pipe()
    release_r, release_w = os.pipe()
    debugger = os.fork()
    if debugger == 0:  # pragma: no cover - runs in the forked debugger
        code = 1
        try:
            os.close(ready_r)
            os.close(release_w)
            _debug(state_dir, job_id, hold_s, ready=ready_w, release=release_r)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(release_r)
    try:
        with os.fdopen(ready_r) as ready:  # the launch holds this pipe too: a debugger that failed never closes it
            said = ready.readline().strip() if select.select([ready], [], [], 30)[0] else ""
        if said.startswith("no debugger"):
            pytest.skip(f"{said}: this machine does not let a process trace its child")
        if not said.isdigit():
            pytest.fail("the debugger could not start the launch (its traceback is in the captured stderr)")
        yield int(said)
    finally:
        os.close(release_w)  # from now on the debugger lets go at once
        LocalLauncher(state_dir, cgroups=False).end_leftovers(timeout_s=30)  # what the test left running
        _wait_for_exit(debugger)


def _debug(state_dir: Path, job_id: int, hold_s: float, *, ready: int, release: int) -> None:  # pragma: no cover
    """Start the launch, trace its guard, and hold the guard at its exit for ``hold_s`` or until
    ``release`` closes; every other stop goes on as it would without a debugger."""
    launcher = LocalLauncher(state_dir, cgroups=False)
    guard = launcher.start(job_id, lambda: time.sleep(600) or 0, {})
    try:
        _ptrace(PTRACE_SEIZE, guard, PTRACE_O_TRACEEXIT)
    except OSError as e:
        launcher.kill_job(job_id, guard)
        os.waitpid(guard, 0)
        os.write(ready, f"no debugger ({e})\n".encode())
        return
    os.write(ready, f"{guard}\n".encode())
    while True:
        _, status = os.waitpid(guard, 0)
        if not os.WIFSTOPPED(status):
            return  # gone, and reaped
        event = status >> 16
        if event == PTRACE_EVENT_EXIT:
            select.select([release], [], [], hold_s)
        elif event:
            continue  # a group stop (the SIGSTOP delivered): it stays stopped, as without a debugger
        with contextlib.suppress(ProcessLookupError):  # SIGKILL took it out of a signal's stop: it goes on to its exit
            _ptrace(PTRACE_CONT, guard, 0 if event else os.WSTOPSIG(status))


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
        expected = f"launches of jobs [{JOB}] still run 0.5 s after SIGKILL"
        with pytest.raises(TimeoutError, match=re.escape(expected)):
            restarted.end_leftovers(timeout_s=0.5)
        assert restarted.running(JOB), "the launch named still runs"
        assert not restarted.running(JOB + 1), "the launch that died of SIGKILL is gone"
    earlier.reap()


def test_a_leftover_slow_to_die_is_waited_for_and_its_job_returned_once_gone(tmp_path):
    with held_launch(tmp_path, JOB, hold_s=1.0):
        restarted = LocalLauncher(tmp_path, cgroups=False)
        started = time.monotonic()
        assert restarted.end_leftovers(timeout_s=30) == [JOB]
        assert time.monotonic() - started >= 1.0, "it returned before the held launch was gone"
        assert not restarted.running(JOB)
