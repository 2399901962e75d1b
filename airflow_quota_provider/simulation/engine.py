"""Discrete-event replay of a workload through ``policy.decide``, the function the executor calls.

The event loop is SimPy's core in miniature (:class:`Environment`): a heap keyed
``(time, priority, seq)``, ``now`` that only moves when :meth:`Environment.step` pops an event, and
``schedule``/``peek``/``step``/``run``. At one moment, finishes and stops run before arrivals, and
the policy is asked last, once per job queue that changed (:data:`DECIDE`), so a burst of events at
the same second costs one decision.

What the replay does with a :class:`~airflow_quota_provider.policy.Decision`, exactly as the
executor does:

- ``admit``: the job starts now (with hosts, on the host the decision names) and, unless stopped,
  finishes ``remaining work`` later.
- ``preempt``: the victim keeps running and holding its GPUs for its quota's ``grace_period_s``,
  passed back to ``decide`` in ``running`` with ``preempted_for`` set. When the grace period ends it
  stops and loses the work done since its last checkpoint (a checkpoint every
  ``checkpoint_interval_s`` of run time; none when that is 0 or unset), then goes back to its queue
  at its original submit time, or fails when the preemption said ``fail``.
- ``reject``: the job can never run; it is counted and reported, never retried.

With ``runtime_noise`` (not None), every job, waiting or running, tells the policy how long its run
is expected to take (``expected_runtime_s``): the work it has left times a factor drawn once per job,
``exp(N(0, runtime_noise))`` from ``random.Random(runtime_seed)`` (0: exact), to show what
imperfect estimates cost. Without it no job has an expected runtime, as before. A job that outlives
its estimate by its quota's ``spare_finishing_within_s`` may be preempted again though nothing else
happened, so the policy is asked again then, as the executor's next cycle would be.

Given hosts per job queue, the replay passes them to ``decide`` with each running job's host, and
checks as it goes that no host holds more GPUs than it has. A job larger than every host of its
queue runs as a gang (:func:`gang_nodes`: 64 GPUs on 8-GPU hosts are 8 nodes of 8), as its team
would ask for it on such a fleet. Without hosts each queue is one implicit host of its capacity, as
the policy sees it, and a job is its GPUs in all.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_quota_provider.policy import Host, Job, Queue, QuotaFile, State, decide as policy_decide
from airflow_quota_provider.policy.accounting import Hold, collector_paused, lost_span, within
from airflow_quota_provider.policy.backlog import Backlog
from airflow_quota_provider.policy.capacity import CohortTree
from airflow_quota_provider.policy.preemption_policy import grace_period_of, next_timer
from airflow_quota_provider.policy.running import Running
from airflow_quota_provider.simulation.policies import PolicySetup
from airflow_quota_provider.simulation.workload import InputError, TraceJob

# Event priorities at equal time: capacity is freed before new work arrives; the policy runs last.
FINISH, STOP, ARRIVE, DECIDE = 0, 1, 2, 3
PREEMPTING_DECISIONS_PER_JOB_AT_AN_INSTANT = 10
"""A queue's decisions that preempt at one instant, beyond this many per job it holds (plus 100),
mean the policy goes round in circles (with a grace period of 0 a victim stops, and waits again, at
the instant it was preempted; arrivals and ends at one instant are progress, preemptions need not be):
the replay stops with an error instead of running for ever."""


def checkpoint_times(start: float, now: float, interval: float) -> tuple[float, float]:
    """The last checkpoint at or before ``now`` of a run begun at ``start`` (``start`` itself when none
    yet), and the next one, after ``now``. ``(now - start) / interval`` can round to just below a whole
    number (``(4.1 - 0.2) / 0.3`` is 12.9999...): stepping on from there keeps the next one after ``now``,
    where the replay would otherwise refresh the same checkpoint forever."""
    last = start + math.floor((now - start) / interval) * interval
    while last + interval <= now:
        last += interval
    return last, last + interval


def gang_nodes(gpus: int, largest_host: int) -> int:
    """The nodes a job of ``gpus`` runs as when no host holds it: the fewest that split its GPUs
    evenly with no node larger than the largest host (16 GPUs on 8-GPU hosts: 2 nodes of 8)."""
    nodes = -(-gpus // largest_host)
    while gpus % nodes:
        nodes += 1
    return nodes


def _changed(job: Job, **changes: Any) -> Job:
    """``dataclasses.replace(job, **changes)`` for a fifth of its cost (a replay changes ~500,000 jobs,
    most of them to note a checkpoint): a :class:`Job` is plain frozen data, each field kept as given
    (no ``__post_init__``), so its attributes with the changes make the job ``replace`` would build."""
    fields = job.__dict__.copy()
    fields.update(changes)
    return _job_of(fields)


def _checkpointed(job: Job, last: float) -> Job:
    """``_changed(job, last_checkpoint_at=last)`` without the keyword dict: two thirds of the copies."""
    fields = job.__dict__.copy()
    fields["last_checkpoint_at"] = last
    return _job_of(fields)


def _job_of(fields: dict[str, Any]) -> Job:
    changed = object.__new__(Job)
    object.__setattr__(changed, "__dict__", fields)  # a third faster than updating the new job's own
    return changed


class CheckError(RuntimeError):
    """A run broke one of its built-in checks (conservation, zero wait, capacity, liveness)."""


class Environment:
    """A SimPy-style event loop: callbacks on a heap keyed ``(time, priority, seq)``."""

    def __init__(self, initial_time: float = 0.0) -> None:
        self._now = float(initial_time)
        self._heap: list[tuple[float, int, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = itertools.count()

    @property
    def now(self) -> float:
        return self._now

    def schedule(self, time: float, priority: int, callback: Callable[..., None], *args: Any) -> None:
        if not time >= self._now:  # also rejects NaN
            raise ValueError(f"cannot schedule at {time!r}, before now ({self._now!r})")
        heapq.heappush(self._heap, (float(time), priority, next(self._seq), callback, args))

    def peek(self) -> float:
        """The time of the next event, ``inf`` when there is none."""
        return self._heap[0][0] if self._heap else math.inf

    def step(self) -> None:
        time, _priority, _seq, callback, args = heapq.heappop(self._heap)
        self._now = time
        callback(*args)

    def run(self, until: float | None = None) -> None:
        """Process events until the heap is empty, or those before ``until``."""
        if until is None:
            while self._heap:
                self.step()
            return
        if not isinstance(until, (int, float)) or not until >= self._now:
            raise ValueError(f"until={until!r} must be a time at or after now ({self._now!r})")
        while self._heap and self._heap[0][0] < until:
            self.step()
        self._now = float(until)


class SimJob:
    """The simulator's record of one job across its attempts."""

    __slots__ = (
        "trace", "quota", "queue", "priority", "checkpoint", "remaining", "status", "ready_at", "wait",
        "first_start", "end", "start", "attempt", "preemptions", "busy", "lost", "in_quota", "reclaim",
        "job", "stop_fail", "message", "estimate_factor",
    )

    def __init__(self, trace: TraceJob, quota: str, queue: "_QueueRun", priority: int, checkpoint: float) -> None:
        self.trace = trace
        self.quota = quota  # the quota of the configuration as given; figures are reported per this
        self.queue = queue
        self.priority = priority
        self.checkpoint = checkpoint  # seconds of run time between checkpoints; 0 = none
        self.remaining = trace.duration_s
        self.status = "future"  # future | pending | running | completed | failed | rejected
        self.ready_at = 0.0
        self.wait = 0.0
        self.first_start: float | None = None
        self.end: float | None = None
        self.start = 0.0
        self.attempt = 0
        self.preemptions = 0
        self.busy = 0.0  # GPU-seconds held, lost work included
        self.lost = 0.0  # GPU-seconds of work lost to preemption
        self.in_quota = False
        self.reclaim = False
        self.job: Job | None = None
        self.stop_fail = False
        self.message = ""
        self.estimate_factor: float | None = None
        """Expected runtime / work left; None: the policy is told no runtime."""


class _Usage:
    """One reported quota's (or cohort's) GPUs in use and jobs waiting over time, integrated as it changes."""

    __slots__ = ("name", "capacity", "queue", "used", "pending_gpus", "pending_jobs", "last", "busy_area",
                 "in_area", "over_area", "preemptions", "index", "cohorts")

    def __init__(self, name: str, capacity: int, queue: "_QueueRun", index: int, start: float) -> None:
        self.name = name
        self.capacity = capacity
        self.queue = queue
        self.index = index
        self.used = 0
        self.pending_gpus = 0
        self.pending_jobs = 0
        self.last = start
        self.busy_area = 0.0  # GPU-seconds in use
        self.in_area = 0.0  # GPU-seconds in use within the quota's capacity
        self.over_area = 0.0  # GPU-seconds in use above it (borrowed)
        self.preemptions = 0
        self.cohorts: tuple[_Usage, ...] = ()
        """A quota's cohorts, its own first: their figures change with its own."""

    def change(self, now: float, gpus: int) -> None:
        """``gpus`` more in use (fewer, when negative) from ``now`` on, here and in its cohorts."""
        for usage in (self, *self.cohorts):
            usage.advance(now)
            usage.used += gpus

    def advance(self, now: float) -> None:
        span = now - self.last
        if span > 0 and self.used:
            self.busy_area += span * self.used
            kept = within(self.capacity, self.used)
            self.in_area += span * kept
            self.over_area += span * (self.used - kept)
        self.last = now


class _QueueRun:
    __slots__ = ("queue", "hosts", "host_gpus", "host_used", "largest_host", "running", "pending", "used",
                 "decide_at", "checkpoints", "timed", "wake_at", "instant", "at_instant", "type_used", "host_type")

    def __init__(self, queue: Queue, hosts: tuple[Host, ...] | None) -> None:
        self.queue = queue  # as the policy sees it (after the policy's rewrite of the quota file)
        self.hosts = hosts  # None: one implicit host of the capacity
        self.host_gpus = {h.name: h.gpus for h in hosts or ()}
        self.host_used = dict.fromkeys(self.host_gpus, 0)
        self.largest_host = max(self.host_gpus.values()) if hosts else None
        self.running = Running()  # both kept between decisions, so that one costs what it places
        self.pending = Backlog()
        self.used = 0
        self.decide_at: float | None = None
        self.checkpoints: list[tuple[float, int, str, SimJob]] = []
        """Each running job's next checkpoint: (time, attempt, id, job); the id orders ties, never the job."""
        self.timed = any(q.min_runtime_s > 0 or q.preemption_delay_s > 0 for q in queue.quotas)
        self.wake_at: float | None = None
        self.instant = -math.inf
        """When the queue's last decision that preempted was made, and how many it made then."""
        self.at_instant = 0
        self.type_used = {t.name: 0 for t in queue.types}
        """GPUs in use per GPU type (a queue with types)."""
        self.host_type = {h.name: h.type for h in hosts or ()}


@dataclass
class SimulationResult:
    """Everything a run produced; :mod:`.metrics` turns it into figures."""

    policy: str
    jobs: list[SimJob]
    usage: dict[str, _Usage]
    capacity: int
    start: float
    end: float
    decisions: int
    timeline: list[tuple[float, int, int, int]] | None
    """(time, quota index, change in GPUs in use, change in waiting jobs), when recorded."""
    quota_names: list[str] = field(default_factory=list)
    placed: bool = False
    """True when the replay had hosts: jobs were placed on them and their size was bound by them."""
    cohorts: dict[str, _Usage] = field(default_factory=dict)
    """Per cohort of the quota file, its subtree's usage over time (capacity: what the subtree owns)."""
    cohort_quotas: dict[str, list[str]] = field(default_factory=dict)
    """Per cohort, the quotas in its subtree."""
    holds: list[Hold] = field(default_factory=list)
    """Every attempt's GPUs held, for :mod:`~airflow_quota_provider.policy.accounting` (as the live system's)."""
    quota_file: QuotaFile | None = None


DecideFn = Callable[[State, float], Any]
# The replay acts on admissions, preemptions and rejections only: no pending reasons to write.
QUIET_DECIDE: DecideFn = functools.partial(policy_decide, explain=False)


class Simulator:
    """One replay of one workload under one policy setup."""

    def __init__(
        self,
        quota_file: QuotaFile,
        setup: PolicySetup,
        jobs: Sequence[TraceJob],
        *,
        checkpoint_interval_s: float = 0.0,
        decide: DecideFn = QUIET_DECIDE,
        record_timeline: bool = False,
        on_progress: Callable[[float], None] | None = None,
        progress_every: int = 2000,
        hosts: dict[str, tuple[Host, ...]] | None = None,
        runtime_noise: float | None = None,
        runtime_seed: int = 0,
    ) -> None:
        """``hosts``: each job queue's hosts, by queue name; None for one implicit host per queue.
        ``runtime_noise``: see the module's docstring."""
        if not jobs:
            raise InputError("--trace", "no jobs to simulate")
        self.setup = setup
        self.decide_fn = decide
        self.env = Environment(min(j.submit_time_s for j in jobs))
        self.start = self.env.now
        self.placed = hosts is not None
        self.queues = {q.name: _QueueRun(q, None if hosts is None else hosts[q.name]) for q in setup.quota_file.queues}
        self.usage: dict[str, _Usage] = {}
        self.cohort_usage: dict[str, _Usage] = {}
        """Per cohort of the quota file (whatever the policy), the GPUs of its quotas' jobs."""
        for queue in quota_file.queues:
            run = self.queues[queue.name]
            tree = CohortTree(queue.capacity, queue.quotas, queue.cohorts) if queue.cohorts else None
            for node, cohort in enumerate(queue.cohorts):
                self.cohort_usage[cohort.name] = _Usage(cohort.name, tree.total[node], run, node, self.start)
            for quota in queue.quotas:
                usage = self.usage[quota.name] = _Usage(quota.name, quota.capacity, run, len(self.usage), self.start)
                if tree is not None:
                    path = tree.path[quota.name][:-1]
                    usage.cohorts = tuple(self.cohort_usage[tree.names[node]] for node in path)
        self.timeline: list[tuple[float, int, int, int]] | None = [] if record_timeline else None
        self.on_progress = on_progress
        self.progress_every = progress_every
        self.decisions = 0
        self.holds: list[Hold] = []
        self.quota_file = quota_file
        self.jobs: dict[str, SimJob] = {}
        teams_unknown: dict[str, None] = {}
        placed: dict[str, tuple[str, str] | None] = {}  # per team, its quota and job queue: teams are few
        for trace in jobs:
            if trace.team not in placed:
                quota = quota_file.quota_for_team(trace.team)
                placed[trace.team] = None if quota is None else (quota, quota_file.queue_of(quota).name)
            if placed[trace.team] is None:
                teams_unknown[trace.team] = None
                continue
            quota, queue_name = placed[trace.team]
            run = self.queues[queue_name]
            priority = 0 if setup.equal_priority else (trace.priority or 0)
            checkpoint = trace.checkpoint_interval_s if trace.checkpoint_interval_s is not None else checkpoint_interval_s
            job = SimJob(trace, quota, run, priority, checkpoint or 0.0)
            nodes = 1 if run.largest_host is None or trace.gpus <= run.largest_host else gang_nodes(trace.gpus, run.largest_host)
            job.job = Job(id=trace.id, quota=setup.fifo_quota.get(queue_name, quota), gpus=trace.gpus,
                          priority=priority, submitted_at=trace.submit_time_s, nodes=nodes,
                          gpu_types=trace.gpu_types)
            self.jobs[trace.id] = job
        if teams_unknown:
            names = ", ".join(q.name for queue in quota_file.queues for q in queue.quotas)
            raise InputError("--config", f"no quota for team(s) {', '.join(teams_unknown)}: name a quota after "
                             f"the team or list it under a quota's teams (quotas: {names})")
        if runtime_noise is not None:
            rng = random.Random(runtime_seed)
            for job in self.jobs.values():
                job.estimate_factor = math.exp(rng.gauss(0.0, runtime_noise)) if runtime_noise > 0 else 1.0
        # One arrival on the heap at a time, the next scheduled as it arrives: the heap stays the size
        # of what runs (a few thousand events), not the whole trace. Arrivals at the same second keep
        # their order (a stable sort), and none ever shares a time and priority with another event.
        self._arrivals = iter(sorted(self.jobs.values(), key=lambda job: job.trace.submit_time_s))
        self._next_arrival()

    # -- events -----------------------------------------------------------------------------------

    def _mark(self, run: _QueueRun) -> None:
        now = self.env.now
        if run.decide_at != now:
            run.decide_at = now
            self.env.schedule(now, DECIDE, self._decide, run)

    def _record(self, usage: _Usage, d_used: int, d_waiting: int) -> None:
        if self.timeline is not None:
            self.timeline.append((self.env.now, usage.index, d_used, d_waiting))

    def _next_arrival(self) -> None:
        job = next(self._arrivals, None)
        if job is not None:
            self.env.schedule(job.trace.submit_time_s, ARRIVE, self._arrive, job)

    def _arrive(self, job: SimJob) -> None:
        self._next_arrival()
        now = self.env.now
        usage = self.usage[job.quota]
        run = job.queue
        gpus = job.trace.gpus
        needed = usage.pending_gpus + gpus
        job.in_quota = usage.used + needed <= usage.capacity
        # Within its quota, yet the pool has no room for it: others hold capacity this quota lends.
        job.reclaim = job.in_quota and run.queue.capacity - run.used < needed
        self._enqueue(job, now)

    def _enqueue(self, job: SimJob, now: float) -> None:
        usage = self.usage[job.quota]
        job.status = "pending"
        job.ready_at = now
        if job.estimate_factor is not None:  # as the executor's waiting jobs carry theirs, for the forecast
            job.job = _changed(job.job, expected_runtime_s=job.remaining * job.estimate_factor)
        job.queue.pending.add(job.job)
        usage.pending_gpus += job.trace.gpus
        usage.pending_jobs += 1
        self._record(usage, 0, 1)
        self._mark(job.queue)

    def _release(self, job: SimJob, now: float, *, lost_since: float | None = None) -> None:
        """Free the job's GPUs; ``lost_since``: it was preempted and its work since then is lost."""
        self.holds.append(Hold(job.trace.id, job.quota, job.trace.gpus, job.start, now, None,
                               lost_since is not None, lost_since, job.job.gpu_type))
        usage = self.usage[job.quota]
        usage.change(now, -job.trace.gpus)
        job.queue.used -= job.trace.gpus
        if job.job.gpu_type is not None:
            job.queue.type_used[job.job.gpu_type] -= job.trace.gpus
        if job.job.host is not None:
            per = job.job.gpus_per_node
            for host in job.job.placed_on:
                job.queue.host_used[host] -= per
        job.queue.running.remove(job.trace.id)
        job.busy += (now - job.start) * job.trace.gpus
        self._record(usage, -job.trace.gpus, 0)
        self._mark(job.queue)

    def _finish(self, job: SimJob, attempt: int) -> None:
        if job.attempt != attempt or job.status != "running":
            return
        now = self.env.now
        self._release(job, now)
        job.remaining = 0.0
        job.status = "completed"
        job.end = now

    def _stop(self, job: SimJob, attempt: int) -> None:
        if job.attempt != attempt or job.status != "running":
            return  # it finished during its grace period
        now = self.env.now
        saved = 0.0
        if job.checkpoint > 0:
            saved = min(checkpoint_times(job.start, now, job.checkpoint)[0] - job.start, job.remaining)
        self._release(job, now, lost_since=job.start + saved)
        begin, end = lost_span(job.start, now, job.start + saved)
        job.lost += (end - begin) * job.trace.gpus
        job.remaining -= saved
        if job.stop_fail:
            job.status = "failed"
            job.end = now
            return
        job.job = _changed(job.job, started_at=None, last_checkpoint_at=None, preempted_for=None, host=None, hosts=(),
                          gpu_type=None, preemptions=job.job.preemptions + 1)
        self._enqueue(job, now)

    def _refresh_checkpoints(self, run: _QueueRun, now: float) -> None:
        heap = run.checkpoints
        while heap and heap[0][0] <= now:
            _, attempt, job_id, job = heap[0]
            if job.status != "running" or job.attempt != attempt:
                heapq.heappop(heap)
                continue
            last, following = checkpoint_times(job.start, now, job.checkpoint)
            job.job = _checkpointed(job.job, last)
            run.running.swap(job.job)  # only last_checkpoint_at changed
            heapq.heapreplace(heap, (following, attempt, job_id, job))

    def _decide(self, run: _QueueRun) -> None:
        now = self.env.now
        run.decide_at = None
        if not run.pending:
            return  # nothing to admit, reject or preempt for: the decision is empty by definition
        self._refresh_checkpoints(run, now)
        state = State.for_queue(run.queue, run.running, run.pending, run.hosts)
        decision = self.decide_fn(state, now)
        self.decisions += 1
        if decision.preempt:
            if now != run.instant:
                run.instant, run.at_instant = now, 0
            run.at_instant += 1
            if run.at_instant > PREEMPTING_DECISIONS_PER_JOB_AT_AN_INSTANT * (len(state.running) + len(state.pending)) + 100:
                raise CheckError(
                    f"{self.setup.name}: queue {run.queue.name} made {run.at_instant} decisions that preempt at "
                    f"t={now:g} s without time moving on, the last one preempting {[p.id for p in decision.preempt]} "
                    f"and admitting {list(decision.admit)}: the policy goes round in circles"
                )
        if self.on_progress is not None and self.decisions % self.progress_every == 0:
            self.on_progress(now)
        for rejection in decision.reject:
            job = self._pending_job(run, rejection.id, "reject")
            run.pending.remove(job.trace.id)
            self._unpend(job)
            job.status = "rejected"
            job.end = now
            job.message = rejection.reason
        for preemption in decision.preempt:
            job = self.jobs.get(preemption.id)
            if job is None or job.status != "running" or job.queue is not run:
                raise CheckError(f"policy preempted {preemption.id!r}, which is not running in queue {run.queue.name}")
            if job.job.preempted_for is not None:
                raise CheckError(f"policy preempted {preemption.id!r} again while it is still stopping")
            job.job = _changed(job.job, preempted_for=preemption.for_)
            run.running.replace(job.job)
            job.preemptions += 1
            job.stop_fail = bool(preemption.fail)
            job.message = preemption.message if preemption.fail else ""
            self.usage[job.quota].preemptions += 1
            grace = grace_period_of(job.job, run.queue.quota(job.job.quota))
            self.env.schedule(now + grace, STOP, self._stop, job, job.attempt)
        for job_id in decision.admit:
            job = self._pending_job(run, job_id, "admit")
            self._start(run, job, now, decision.hosts.get(job_id), decision.types.get(job_id))
        if run.pending and run.timed:
            self._wake_for_timers(run, now)

    def _wake_for_timers(self, run: _QueueRun, now: float) -> None:
        """Ask again when a time-based rule may let a waiting job through though nothing else changed:
        a running job passing its ``min_runtime_s``, or a waiting one its ``preemption_delay_s``."""
        wake = next_timer(run.running, run.pending, {q.name: q for q in run.queue.quotas}, now)
        if wake < math.inf and run.wake_at != wake:
            run.wake_at = wake
            self.env.schedule(wake, DECIDE, self._wake, run)

    def _past_estimate(self, job: SimJob, attempt: int) -> None:
        if job.attempt == attempt and job.status == "running" and job.queue.pending:
            self._mark(job.queue)

    def _wake(self, run: _QueueRun) -> None:
        run.wake_at = None
        if run.decide_at != self.env.now:
            self._decide(run)

    def _pending_job(self, run: _QueueRun, job_id: str, verb: str) -> SimJob:
        job = self.jobs.get(job_id)
        if job is None or job.status != "pending" or job_id not in run.pending:
            raise CheckError(f"policy tried to {verb} {job_id!r}, which is not pending in queue {run.queue.name}")
        return job

    def _unpend(self, job: SimJob) -> None:
        usage = self.usage[job.quota]
        usage.pending_gpus -= job.trace.gpus
        usage.pending_jobs -= 1
        self._record(usage, 0, -1)

    def _start(self, run: _QueueRun, job: SimJob, now: float, host: str | list[str] | None, gpu_type: str | None) -> None:
        run.pending.remove(job.trace.id)
        self._unpend(job)
        gpus = job.trace.gpus
        run.used += gpus
        if run.used > run.queue.capacity:
            raise CheckError(f"policy admitted {job.trace.id!r} ({gpus} GPUs) at t={now:g}: queue {run.queue.name} "
                             f"would use {run.used} GPUs of {run.queue.capacity}")
        if run.type_used:  # a queue with GPU types: each type within its capacity, a job on a type it asked for
            capacity = {t.name: t.capacity for t in run.queue.types}
            if gpu_type not in capacity or (job.job.gpu_types and gpu_type not in job.job.gpu_types):
                raise CheckError(f"policy admitted {job.trace.id!r} at t={now:g} on GPU type {gpu_type!r}: it may run on "
                                 f"{', '.join(job.job.gpu_types or capacity)}")
            run.type_used[gpu_type] += gpus
            if run.type_used[gpu_type] > capacity[gpu_type]:
                raise CheckError(f"policy admitted {job.trace.id!r} ({gpus} GPUs) at t={now:g}: {gpu_type} of queue "
                                 f"{run.queue.name} would use {run.type_used[gpu_type]} GPUs of {capacity[gpu_type]}")
        hosts: tuple[str, ...] = ()
        if run.hosts is not None:
            nodes = job.job.nodes
            hosts = (host,) if nodes == 1 else tuple(host or ())
            if len(set(hosts)) != nodes:
                raise CheckError(f"policy admitted {job.trace.id!r} at t={now:g} on hosts {host!r}: it has {nodes} "
                                 f"{'node' if nodes == 1 else 'nodes'}, each on a host of its own")
            per = job.job.gpus_per_node
            for name in hosts:
                if name not in run.host_used:
                    raise CheckError(f"policy admitted {job.trace.id!r} at t={now:g} on host {name!r}, not one of "
                                     f"queue {run.queue.name}'s hosts")
                if run.host_type[name] != gpu_type:
                    raise CheckError(f"policy admitted {job.trace.id!r} at t={now:g} as {gpu_type} on host {name}, "
                                     f"whose GPUs are {run.host_type[name]}")
                run.host_used[name] += per
                if run.host_used[name] > run.host_gpus[name]:
                    raise CheckError(f"policy admitted {job.trace.id!r} ({per} GPUs there) at t={now:g}: host {name} "
                                     f"would use {run.host_used[name]} GPUs of {run.host_gpus[name]}")
            host = hosts[0]
        usage = self.usage[job.quota]
        usage.change(now, gpus)
        self._record(usage, gpus, 0)
        job.status = "running"
        job.attempt += 1
        job.start = now
        job.wait += now - job.ready_at
        if job.first_start is None:
            job.first_start = now
        expected = None if job.estimate_factor is None else job.remaining * job.estimate_factor
        job.job = _changed(job.job, started_at=now, last_checkpoint_at=now, host=host, expected_runtime_s=expected,
                           hosts=hosts if len(hosts) > 1 else (), gpu_type=gpu_type)
        run.running.add(job.job)
        self.env.schedule(now + job.remaining, FINISH, self._finish, job, job.attempt)
        if expected is not None and expected < job.remaining:
            # Spared no longer once past its expected end by its quota's spare_finishing_within_s: the
            # executor's next cycle would see that, so the replay asks then too.
            spared_until = now + expected + run.queue.quota(job.job.quota).spare_finishing_within_s
            if spared_until < now + job.remaining:
                self.env.schedule(spared_until, DECIDE, self._past_estimate, job, job.attempt)
        if job.checkpoint > 0:
            heapq.heappush(run.checkpoints, (now + job.checkpoint, job.attempt, job.trace.id, job))

    # -- the run ----------------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        with collector_paused():  # a replay makes no reference cycles, only millions of objects
            self.env.run()
        stuck = [j for j in self.jobs.values() if j.status in ("pending", "running", "future")]
        if stuck:
            sample = stuck[0]
            run = sample.queue
            decision = policy_decide(State.for_queue(run.queue, run.running, run.pending, run.hosts),
                                     self.env.now)
            reason = next((p.reason for p in decision.pending if p.id == sample.trace.id), "no reason given")
            raise CheckError(
                f"{self.setup.name}: {len(stuck)} job(s) never finished and nothing is left to happen, e.g. "
                f"{sample.trace.id!r} ({sample.trace.gpus} GPUs, quota {sample.quota}): {reason}"
            )
        end = max((j.end for j in self.jobs.values() if j.end is not None), default=self.start)
        for usage in (*self.usage.values(), *self.cohort_usage.values()):
            usage.advance(end)
        return SimulationResult(
            policy=self.setup.name,
            jobs=list(self.jobs.values()),
            usage=self.usage,
            capacity=sum(q.capacity for q in self.setup.quota_file.queues),
            start=self.start,
            end=end,
            decisions=self.decisions,
            timeline=self.timeline,
            quota_names=list(self.usage),
            placed=self.placed,
            cohorts=self.cohort_usage,
            cohort_quotas={name: [q for q, u in self.usage.items() if usage in u.cohorts] for name, usage in self.cohort_usage.items()},
            holds=self.holds,
            quota_file=self.quota_file,
        )
