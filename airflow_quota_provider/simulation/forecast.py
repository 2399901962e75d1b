"""Estimated start times of waiting jobs: the replay engine run forward from a live state (Slurm's
``squeue --start``), deciding with the same ``policy.decide`` the executor calls.

What the forecast assumes, and so what an estimate means:

- **No new work arrives** and nobody edits priorities or the quota file: a job submitted later at a
  higher priority, or to a quota that reclaims, delays the estimates (as in Slurm).
- **Running jobs end when expected**: at ``started_at + expected_runtime_s``. One already past that
  is expected to end now (its estimate was short; nothing better is known). A job stopping after a
  preemption ends when its quota's grace period after ``now`` would, at the latest.
- **A job of unknown runtime never ends** within the forecast (nothing says when it would): jobs that
  only its GPUs could start get no estimate (``None``, "unknown"), never a made-up one.
- Preemptions happen as the policy decides them: a victim stops one grace period later and waits
  again with its whole expected runtime ahead (its checkpoints are not modelled), so estimates
  behind it lean late.
- Jobs not started within ``horizon_s`` get ``None``.

Event times are snapped up to a grid that coarsens with the distance from ``now`` (``resolution_s``,
doubling while it stays within ``relative`` of the distance; 0: no grid): an estimate an hour out is then off by
at most about ``relative`` of an hour more than the exact forecast would be, and ten thousand waiting
jobs cost a few hundred decisions instead of one per job that ends.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import replace

from airflow_quota_provider.policy import Job, State, decide
from airflow_quota_provider.policy.backlog import Backlog
from airflow_quota_provider.policy.preemption_policy import grace_period_of, next_timer
from airflow_quota_provider.policy.running import Running
from airflow_quota_provider.simulation.engine import Environment

# Event priorities at one moment, as in the replay: GPUs are freed before the policy decides.
_FREE, _DECIDE = 0, 1

RESOLUTION_S = 30.0
RELATIVE = 0.05
HORIZON_S = 30 * 86400.0


def estimate_starts(
    state: State,
    now: float,
    *,
    horizon_s: float = HORIZON_S,
    resolution_s: float = RESOLUTION_S,
    relative: float = RELATIVE,
) -> dict[str, float | None]:
    """When each waiting job of ``state`` is expected to start (seconds, ``now``'s clock), or None
    where the forecast cannot say (see the module docstring). ``state`` is never changed."""
    return Forecast(state, now, horizon_s=horizon_s, resolution_s=resolution_s, relative=relative).run()


class Forecast:
    """One forecast; :func:`estimate_starts` is the way to run one, this class tells also how many
    decisions it took (``decisions``, for the benchmark)."""

    def __init__(
        self,
        state: State,
        now: float,
        *,
        horizon_s: float = HORIZON_S,
        resolution_s: float = RESOLUTION_S,
        relative: float = RELATIVE,
    ) -> None:
        self.state = state
        self.now = now
        self.until = now + horizon_s
        self.resolution = resolution_s
        self.relative = relative
        self.env = Environment(now)
        self.quotas = {q.name: q for q in state.quotas}
        self.running = Running(state.running)
        """Our own, kept between decisions as the replay keeps its own: a decision then costs what it
        places, not a count of every running job."""
        self.attempt: dict[str, int] = {}
        """Running job -> its attempt's number: an end scheduled for an earlier attempt is stale."""
        self.attempts = itertools.count(1)
        self.backlog = Backlog(state.pending)  # our own copy: the caller's may be kept and updated
        self.starts: dict[str, float | None] = dict.fromkeys(job.id for job in state.pending)
        self.decide_at: float | None = None
        self.decisions = 0
        self.wake_at: float | None = None
        self.timed = any(q.min_runtime_s > 0 or q.preemption_delay_s > 0 for q in state.quotas)
        for job in self.running:
            attempt = self.attempt[job.id] = next(self.attempts)
            end = _expected_end(job, now)
            stops = False  # a victim still stopping waits again, unless it ends on its own first
            if job.preempted_for is not None:
                grace_end = now + grace_period_of(job, self.quotas[job.quota])
                stops = end is None or grace_end < end
                end = grace_end if stops else end
            if end is not None:
                self._at(end, _FREE, self._free, job.id, attempt, stops)
        self._mark()

    def _snap(self, time: float) -> float:
        """``time`` rounded up to the grid at its distance from ``now`` (module docstring)."""
        distance = time - self.now
        if distance <= 0:
            return self.now
        if not self.resolution:
            return time  # no grid: exact, one decision per distinct end
        step = self.resolution
        while step * 2 <= distance * self.relative:
            step *= 2
        return self.now + math.ceil(distance / step) * step

    def _at(self, time: float, priority: int, callback, *args) -> None:
        time = self._snap(time)
        if time <= self.until:
            self.env.schedule(time, priority, callback, *args)

    def _mark(self) -> None:
        if self.decide_at != self.env.now:
            self.decide_at = self.env.now
            self.env.schedule(self.env.now, _DECIDE, self._decide)

    def _free(self, job_id: str, attempt: int, requeue: bool) -> None:
        """A running job ends (``requeue``: no, it was preempted and waits again)."""
        if self.attempt.get(job_id) != attempt:
            return  # preempted and stopped earlier
        job = self.running.remove(job_id)
        del self.attempt[job_id]
        if requeue:
            self.backlog.add(replace(job, started_at=None, last_checkpoint_at=None, preempted_for=None, host=None,
                                     hosts=(), gpu_type=None, preemptions=job.preemptions + 1))
        if self.backlog:
            self._mark()

    def _decide(self) -> None:
        now = self.env.now
        self.decide_at = None
        if not self.backlog:
            return
        state = replace(self.state, running=self.running, pending=self.backlog)
        decision = decide(state, now, explain=False)
        self.decisions += 1
        for rejection in decision.reject:
            self.backlog.remove(rejection.id)
        for preemption in decision.preempt:
            victim = replace(self.running.get(preemption.id), preempted_for=preemption.for_)
            self.running.replace(victim)
            attempt = self.attempt[victim.id] = next(self.attempts)
            grace = grace_period_of(victim, self.quotas[victim.quota])
            self._at(now + grace, _FREE, self._free, victim.id, attempt, not preemption.fail)
        for job_id in decision.admit:
            where = decision.hosts.get(job_id)  # a gang's: its nodes' hosts, node 0's first
            hosts = () if where is None or isinstance(where, str) else tuple(where)
            job = replace(self.backlog.remove(job_id), started_at=now, host=hosts[0] if hosts else where,
                          hosts=hosts, gpu_type=decision.types.get(job_id))
            self.running.add(job)
            attempt = self.attempt[job_id] = next(self.attempts)
            if job_id in self.starts and self.starts[job_id] is None:
                self.starts[job_id] = now
            if job.expected_runtime_s is not None:  # unknown: holds its GPUs for the rest of the forecast
                self._at(now + job.expected_runtime_s, _FREE, self._free, job_id, attempt, False)
        if self.backlog and self.timed:
            self._wake_for_timers(now)

    def _wake_for_timers(self, now: float) -> None:
        """Decide again when a running job passes its ``min_runtime_s`` or a waiting one its
        ``preemption_delay_s``, as the replay does."""
        wake = next_timer(self.running, self.backlog, self.quotas, now)
        if wake < math.inf and self.wake_at != wake:
            self.wake_at = wake
            self._at(wake, _DECIDE, self._wake)

    def _wake(self) -> None:
        self.wake_at = None
        self._mark()

    def run(self) -> dict[str, float | None]:
        self.env.run()
        return self.starts


def _expected_end(job: Job, now: float) -> float | None:
    """When a running job is expected to end: now, when it is overdue; None when unknown."""
    if job.expected_runtime_s is None or job.started_at is None:
        return None
    return max(now, job.started_at + job.expected_runtime_s)


def describe_start(estimate: float | None, now: float) -> str:
    """A person's reading of an estimate: "expected to start in about 12 min", or why there is none."""
    if estimate is None:
        return "start time unknown (a job it waits for has no expected runtime, or it is too far ahead)"
    return f"expected to start {_in_about(estimate - now)}"


def _in_about(seconds: float) -> str:
    if seconds < 60:
        return "within a minute"
    for unit, size in (("day", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size or unit == "min":
            amount = round(seconds / size)
            return f"in about {amount} {unit}" + ("s" if unit == "day" and amount != 1 else "")
    raise AssertionError("unreachable")

