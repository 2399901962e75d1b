"""Estimated start times, forecast off the scheduler's critical path.

Every ``[quota] estimate_interval_s`` at most, a cycle hands a snapshot of the states it decided on
(immutable :class:`~airflow_quota_provider.policy.State` values; the kept Backlog copied to a tuple)
to one background thread, which runs :func:`~airflow_quota_provider.simulation.forecast.estimate_starts`
for each job queue. A later cycle collects the result and writes ``quota_job.estimated_start_at`` in
its own transaction: the database keeps one writer per scheduler (SQLite has one lock for the whole
file) and the thread never touches a session. Only estimates that moved by more than a tolerance are
written, so a steady queue costs no writes. The thread holds the GIL while it computes (about a
second for ten thousand waiting jobs), so the scheduler slows for that second, never blocks.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from sqlalchemy import bindparam

from airflow_quota_provider.models.job import JobState, QuotaJob
from airflow_quota_provider.simulation.forecast import estimate_starts

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_quota_provider.policy import State

TOLERANCE_S = 30.0
"""An estimate that moved by less (and not from or to unknown) is not written again."""
RELATIVE_TOLERANCE = 0.05
"""Nor one that moved by less than this share of the wait ahead of it."""


def forecast(states: dict[str, State], now: float) -> dict[str, float | None]:
    """Job id -> estimated start, for every waiting job of every job queue in ``states``."""
    starts: dict[str, float | None] = {}
    for state in states.values():
        starts.update(estimate_starts(state, now))
    return starts


class StartEstimates:
    """One background forecast at a time; results go to the table through :meth:`write`."""

    def __init__(self, interval_s: float, log: logging.Logger, clock=time.monotonic) -> None:
        self.interval_s = interval_s
        self.log = log
        self._clock = clock
        self._pool: ThreadPoolExecutor | None = None
        self._running: Future | None = None
        self._last_started = -float("inf")
        self._written: dict[str, float | None] = {}
        """Job id -> the estimate last written for it."""

    def submit(self, states: dict[str, State], now: float) -> bool:
        """Start a forecast of ``states`` unless one is running or the last began under
        ``interval_s`` ago; True when one started."""
        if self.interval_s <= 0 or not states or self._running is not None:
            return False
        if self._clock() - self._last_started < self.interval_s:
            return False
        # The executor keeps each queue's Backlog and updates it next cycle: the thread gets a copy.
        snapshot = {name: replace(state, pending=tuple(state.pending)) for name, state in states.items()}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="quota-estimates")
        self._last_started = self._clock()
        self._running = self._pool.submit(forecast, snapshot, now)
        return True

    def write(self, now: float, *, session: Session) -> int:
        """Write a finished forecast's estimates that moved (waiting jobs only); the rows written.

        A forecast that failed is logged and dropped, never the cycle: the next one runs after
        ``interval_s``."""
        if self._running is None or not self._running.done():
            return 0
        future, self._running = self._running, None
        try:
            starts = future.result()
        except Exception:
            self.log.exception("Estimating start times failed; retried in %g s", self.interval_s)
            return 0
        changed = [
            {"job_id": int(job_id), "estimate": estimate}
            for job_id, estimate in starts.items()
            if _moved(self._written.get(job_id, _NEVER), estimate, now)
        ]
        self._written = starts
        if changed:
            table = QuotaJob.__table__
            session.connection().execute(  # one executemany, no ORM objects for ten thousand rows
                table.update()
                .where(table.c.id == bindparam("job_id"), table.c.state == JobState.PENDING.value)
                .values(estimated_start_at=bindparam("estimate")),
                changed,
            )
        return len(changed)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the running forecast, if any, is done (for shutdown and tests)."""
        if self._running is not None:
            self._running.exception(timeout)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


_NEVER = object()


def _moved(before: object, after: float | None, now: float) -> bool:
    if before is _NEVER or (before is None) != (after is None):
        return True
    if after is None:
        return False
    return abs(after - before) > max(TOLERANCE_S, RELATIVE_TOLERANCE * abs(after - now))
