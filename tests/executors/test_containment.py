"""The wait a GPU host's launch watch blocks in (:func:`wait_for_an_exit`): an exit wakes it, not
its next poll, so a reclaimed GPU is reported free when its victim exits."""

from __future__ import annotations

import subprocess
import sys
import time

from airflow_quota_provider.executors.containment import process_alive, wait_for_an_exit

LONG_S = 60.0
"""A timeout no wait here should reach: returning well before it means an exit woke the wait."""


def _sleeper(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_an_exit_wakes_the_wait_before_its_timeout():
    lingering, exiting = _sleeper(LONG_S), _sleeper(0.5)
    try:
        started = time.monotonic()
        wait_for_an_exit([lingering.pid, exiting.pid], LONG_S)
        assert time.monotonic() - started < LONG_S / 2, "the wait ran to its timeout"
        assert exiting.poll() is not None or not process_alive(exiting.pid)
        assert process_alive(lingering.pid)
    finally:
        for process in (lingering, exiting):
            process.kill()
            process.wait()


def test_without_an_exit_the_wait_lasts_its_timeout():
    lingering = _sleeper(LONG_S)
    try:
        started = time.monotonic()
        wait_for_an_exit([lingering.pid], 0.3)
        assert time.monotonic() - started >= 0.3
        assert process_alive(lingering.pid)
    finally:
        lingering.kill()
        lingering.wait()


def test_a_process_gone_already_returns_at_once():
    gone = _sleeper(0)
    gone.wait()  # reaped: its pid names no process
    started = time.monotonic()
    wait_for_an_exit([gone.pid], LONG_S)
    assert time.monotonic() - started < LONG_S / 2


def test_with_nothing_to_watch_the_wait_is_a_poll():
    started = time.monotonic()
    wait_for_an_exit([], 0.2)
    assert time.monotonic() - started >= 0.2
