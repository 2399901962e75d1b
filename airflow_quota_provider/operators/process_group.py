"""A command in its own process group, stopped the quota way: SIGTERM, the grace period, SIGKILL.

:class:`CommandProcess` runs the command of a QuotaTrainingOperator, logs its output, polls the
run's preemption notice every :data:`~airflow_quota_provider.operators.quota_run.POLL_INTERVAL_S`
and, when it appears (or the task is killed), sends SIGTERM to the command's process group, waits
up to the grace period for it to write a checkpoint and exit, then SIGKILLs what is left. If the
task process itself is killed, the command dies with it (``PR_SET_PDEATHSIG``, Linux).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from airflow_quota_provider.executors.containment import die_with_parent
from airflow_quota_provider.operators.quota_run import POLL_INTERVAL_S

if TYPE_CHECKING:
    from airflow_quota_provider.operators.quota_run import QuotaRun


class CommandProcess:
    """One command of a task: started by :meth:`run`, stopped by a notice or by :meth:`kill`."""

    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.kill_requested = False
        """The task was killed (``on_kill``): the command is stopped, and the task fails."""
        self.sigterm_sent = False

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None, run: QuotaRun, log
    ) -> tuple[int, bool]:
        """Run the command until it exits or is stopped; return (exit code, preempted)."""
        self.process = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            process_group=0,
            preexec_fn=die_with_parent,
        )
        log.info("Started command (pid %d, own process group): %s", self.process.pid, argv)
        reader = threading.Thread(target=_log_output, args=(self.process, log), daemon=True)
        reader.start()
        try:
            while True:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    returncode = self.process.wait(timeout=POLL_INTERVAL_S)
                    break
                if run.poll_preemption() is not None or self.kill_requested:
                    returncode = self._stop(run, log)
                    break
            # Stopped by us (poll or kill): an executor may write the notice and then send SIGTERM,
            # so a notice present now makes it a preemption. A command that ended on its own is not.
            return returncode, self.sigterm_sent and run.poll_preemption() is not None
        finally:
            if self.process.poll() is None:  # an exception escaped the loop
                self._signal_group(signal.SIGKILL)
                self.process.wait()
            reader.join(timeout=5)

    def kill(self) -> None:
        """Forward the task's kill to the command now; :meth:`run` then applies the grace period."""
        self.kill_requested = True
        if self.process is not None and self.process.poll() is None and not self.sigterm_sent:
            self._signal_group(signal.SIGTERM)

    def _stop(self, run: QuotaRun, log) -> int:
        """SIGTERM the command, give it the grace period, then SIGKILL it."""
        assert self.process is not None
        notice = run.notice
        if run.gang_node_failed:
            why = "another node of the gang failed"
        else:
            why = f"preempted ({notice.reason}) by {notice.preemptor}" if notice else "task killed"
        started = time.time()
        stop_at = run.stop_at(started)
        log.warning("%s: sending SIGTERM to the command, grace period %.1fs", why.capitalize(), stop_at - started)
        if not self.sigterm_sent:
            self._signal_group(signal.SIGTERM)
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                returncode = self.process.wait(timeout=max(0.0, min(POLL_INTERVAL_S, stop_at - time.time())))
                log.info(
                    "Command stopped within the grace period (exit code %d after %.1fs)",
                    returncode,
                    time.time() - started,
                )
                return returncode
            if time.time() >= stop_at:
                break
            run.poll_preemption()
        log.warning("Command did not stop within the grace period; sending SIGKILL")
        self._signal_group(signal.SIGKILL)
        return self.process.wait()

    def _signal_group(self, sig: int) -> None:
        if self.process is None:
            return
        if sig == signal.SIGTERM:
            self.sigterm_sent = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)


def _log_output(process: subprocess.Popen, log) -> None:
    assert process.stdout is not None
    for raw in iter(process.stdout.readline, b""):
        log.info("%s", raw.decode(errors="replace").rstrip())
