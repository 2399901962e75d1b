"""Workloads the simulator replays: trace CSV files, priority classes, and Kueue's baseline shape.

A trace is one row per job (``job_id,team,submit_time_s,duration_s,gpus`` and, optionally,
``priority`` and ``checkpoint_interval_s``), the format of ``shared/traces/itp_elasticflow.csv``.
Reading never guesses: a bad cell is an :class:`InputError` naming the file, line and column.
"""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from airflow_quota_provider.policy import PreemptionPolicy, Queue, Quota, QuotaFile, Reclaim, Sharing, WithinQuota

SECONDS_PER_DAY = 86_400.0
REQUIRED_COLUMNS = ("job_id", "team", "submit_time_s", "duration_s", "gpus")
OPTIONAL_COLUMNS = ("priority", "checkpoint_interval_s", "gpu_type")


class InputError(ValueError):
    """Bad user input to the simulator; ``str(error)`` is ``"where: message"`` (where = argument, file:line)."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class TraceJob:
    """One job of a workload, as submitted (before the simulator places it on a quota)."""

    id: str
    team: str
    submit_time_s: float
    duration_s: float
    gpus: int
    priority: int | None = None
    """None: not in the trace; the priority classes (or 0) decide."""
    checkpoint_interval_s: float | None = None
    """None: not in the trace; the run's default decides."""
    size_class: str | None = None
    """A label used for per-class figures (the Kueue shape's small/medium/large)."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types it may run on, in its order of preference (column ``gpu_type``: names separated
    by ``|``); empty: any."""


def _number(text: str, where: str, column: str, *, integer: bool, minimum: float, above: bool = False) -> float:
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        kind = "an integer" if integer else "a number"
        raise InputError(where, f"{column}: {text!r} is not {kind}") from None
    if not math.isfinite(value) or value < minimum or (above and value <= minimum):
        bound = f"above {minimum:g}" if above else f"at least {minimum:g}"
        raise InputError(where, f"{column}: {text!r} must be {bound}")
    return value


def load_trace(path: str | Path) -> list[TraceJob]:
    """Read a trace CSV; rows keep their file order (the simulator orders by submit time itself)."""
    name = str(path)
    try:
        handle = open(path, newline="")
    except OSError as error:
        raise InputError("--trace", f"cannot read {name}: {error.strerror}") from None
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None:
            raise InputError(f"{name}:1", "empty file, expected a header " + ",".join(REQUIRED_COLUMNS))
        header = [h.strip() for h in header]
        missing = [c for c in REQUIRED_COLUMNS if c not in header]
        if missing:
            raise InputError(f"{name}:1", f"missing column(s) {', '.join(missing)}; the header needs "
                             f"{','.join(REQUIRED_COLUMNS)} and may add {', '.join(OPTIONAL_COLUMNS)}")
        unknown = [c for c in header if c not in REQUIRED_COLUMNS + OPTIONAL_COLUMNS]
        if unknown:
            raise InputError(f"{name}:1", f"unknown column(s) {', '.join(unknown)}; allowed: "
                             f"{', '.join(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)}")
        index = {column: header.index(column) for column in header}
        i_id, i_team, i_submit, i_dur, i_gpus = (index[c] for c in REQUIRED_COLUMNS)
        i_prio = index.get("priority")
        i_ckpt = index.get("checkpoint_interval_s")
        i_type = index.get("gpu_type")
        jobs: list[TraceJob] = []
        seen: dict[str, int] = {}
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            where = f"{name}:{line}"
            if len(row) != len(header):
                raise InputError(where, f"{len(row)} cells, the header has {len(header)}")
            job_id = row[i_id].strip()
            team = row[i_team].strip()
            if not job_id:
                raise InputError(where, "job_id: empty")
            if not team:
                raise InputError(where, "team: empty")
            if job_id in seen:
                raise InputError(where, f"job_id: duplicate {job_id!r} (also on line {seen[job_id]})")
            seen[job_id] = line
            priority = None
            if i_prio is not None and row[i_prio].strip():
                priority = int(_number(row[i_prio].strip(), where, "priority", integer=True, minimum=-(2**31)))
            checkpoint = None
            if i_ckpt is not None and row[i_ckpt].strip():
                checkpoint = _number(row[i_ckpt].strip(), where, "checkpoint_interval_s", integer=False, minimum=0)
            jobs.append(TraceJob(
                id=job_id,
                team=team,
                submit_time_s=_number(row[i_submit].strip(), where, "submit_time_s", integer=False, minimum=0),
                duration_s=_number(row[i_dur].strip(), where, "duration_s", integer=False, minimum=0, above=True),
                gpus=int(_number(row[i_gpus].strip(), where, "gpus", integer=True, minimum=1)),
                priority=priority,
                checkpoint_interval_s=checkpoint,
                gpu_types=() if i_type is None else _gpu_types(row[i_type], where),
            ))
    if not jobs:
        raise InputError(name, "no jobs in the trace")
    return jobs


def write_trace(jobs: Iterable[TraceJob], path: str | Path) -> None:
    """Write jobs in the trace CSV format (with the optional columns), e.g. a generated workload."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(REQUIRED_COLUMNS + OPTIONAL_COLUMNS)
        for job in jobs:
            writer.writerow([
                job.id, job.team, _exact(job.submit_time_s), _exact(job.duration_s), job.gpus,
                "" if job.priority is None else job.priority,
                "" if job.checkpoint_interval_s is None else _exact(job.checkpoint_interval_s),
                "|".join(job.gpu_types),
            ])


def _gpu_types(text: str, where: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split("|")) if text.strip() else ()
    # A name no job queue has is the policy's to refuse (the job is rejected, naming the queue's types).
    if "" in names:
        raise InputError(where, f"gpu_type: {text.strip()!r} has an empty name; GPU type names separated by '|'")
    if len(set(names)) != len(names):
        raise InputError(where, f"gpu_type: {text.strip()!r} names a type twice")
    return names


def _exact(seconds: float) -> str:
    """A time that reads back as the same float: ``:g`` keeps 6 digits, and traces run past 10^6 s."""
    return str(int(seconds)) if float(seconds).is_integer() else repr(float(seconds))


def select_days(jobs: Sequence[TraceJob], from_day: float | None, to_day: float | None) -> list[TraceJob]:
    """Jobs submitted in ``[from_day, to_day)`` (days since the trace's time origin)."""
    if from_day is not None and (not math.isfinite(from_day) or from_day < 0):
        raise InputError("--from-day", f"{from_day!r} must be a number of days, at least 0")
    if to_day is not None and not math.isfinite(to_day):
        raise InputError("--to-day", f"{to_day!r} must be a number of days")
    if from_day is not None and to_day is not None and to_day <= from_day:
        raise InputError("--to-day", f"{to_day:g} must be after --from-day {from_day:g}")
    low = -math.inf if from_day is None else from_day * SECONDS_PER_DAY
    high = math.inf if to_day is None else to_day * SECONDS_PER_DAY
    selected = [job for job in jobs if low <= job.submit_time_s < high]
    if not selected:
        raise InputError("--from-day" if from_day is not None else "--to-day",
                         f"no job is submitted between day {from_day or 0:g} and day {to_day if to_day is not None else 'end'}")
    return selected


@dataclass(frozen=True)
class PriorityClass:
    name: str
    share: float
    priority: int


def parse_priority_classes(text: str) -> tuple[PriorityClass, ...]:
    """``high=0.2:100,normal=0.8:10``: name=share:priority, shares positive and summing to 1."""
    where = "--priority-classes"
    classes: list[PriorityClass] = []
    for part in text.split(","):
        part = part.strip()
        name, sep, rest = part.partition("=")
        share_text, sep2, priority_text = rest.partition(":")
        if not sep or not sep2 or not name.strip():
            raise InputError(where, f"{part!r} is not name=share:priority (e.g. high=0.2:100,normal=0.8:10)")
        try:
            share = float(share_text)
        except ValueError:
            raise InputError(where, f"{name}: share {share_text!r} is not a number") from None
        try:
            priority = int(priority_text)
        except ValueError:
            raise InputError(where, f"{name}: priority {priority_text!r} is not an integer") from None
        if not (0 < share <= 1) or not math.isfinite(share):
            raise InputError(where, f"{name}: share {share_text!r} must be above 0 and at most 1")
        if any(c.name == name.strip() for c in classes):
            raise InputError(where, f"duplicate class name {name.strip()!r}")
        classes.append(PriorityClass(name.strip(), share, priority))
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > 1e-9:
        raise InputError(where, f"shares sum to {total:g}, they must sum to 1")
    return tuple(classes)


def assign_priorities(
    jobs: Sequence[TraceJob], classes: Sequence[PriorityClass] | None, seed: int
) -> tuple[list[TraceJob], dict[str, str]]:
    """Fill in missing priorities: one draw per job from ``classes`` with ``random.Random(seed)``.

    Draws are made for every job in the given order, whether or not it already has a priority, so a
    job's class does not depend on which other jobs carry one. Jobs without a priority and without
    classes get 0. Returns the jobs and each job's class name (only for drawn priorities).
    """
    if not classes:
        return [job if job.priority is not None else replace(job, priority=0) for job in jobs], {}
    rng = random.Random(seed)
    bounds = []
    running = 0.0
    for c in classes:
        running += c.share
        bounds.append(running)
    out: list[TraceJob] = []
    names: dict[str, str] = {}
    for job in jobs:
        draw = rng.random()
        chosen = classes[-1]
        for c, bound in zip(classes, bounds):
            if draw < bound:
                chosen = c
                break
        if job.priority is None:
            job = replace(job, priority=chosen.priority)
            names[job.id] = chosen.name
        out.append(job)
    return out, names


# Kueue's scheduler performance baseline (test/performance/scheduler/configs/baseline/generator.yaml):
# 5 cohorts x 6 ClusterQueues, nominal quota 20, borrowing limit 100, reclaimWithinCohort Any,
# withinClusterQueue LowerPriority; per ClusterQueue (name, count, interval_s, runtime_s, priority, request).
KUEUE_BASELINE_SETS = (
    ("small", 350, 0.1, 0.2, 50, 1),
    ("medium", 100, 0.5, 0.5, 100, 5),
    ("large", 50, 1.2, 1.0, 200, 20),
)


def kueue_baseline(
    *, groups: int = 5, quotas_per_group: int = 6, capacity: int = 20, borrow_limit: int | None = 100,
    grace_period_s: float = 0.0, spare_finishing_within_s: float = 0.0,
) -> tuple[QuotaFile, list[TraceJob]]:
    """Kueue's baseline shape: each cohort is one job queue of ``quotas_per_group`` quotas.

    Each job set creates one job every ``interval_s``, the first one interval after time 0: Kueue's
    generator (``generateWlSet`` in ``test/performance/scheduler/runner/generator/generator.go``) waits
    ``creationIntervalMs`` before each creation, the first included. The grace period is 0 (Kueue
    evicts at once; its runner's workloads stop immediately) and a job evicted starts its run over.
    ``spare_finishing_within_s`` is every quota's (0, as Kueue has no such rule).
    """
    queues = []
    jobs: list[TraceJob] = []
    for g in range(groups):
        quotas = []
        for q in range(quotas_per_group):
            name = f"cq-{g}-{q}"
            quotas.append(Quota(
                name=name, capacity=capacity, sharing=Sharing.LEND_AND_BORROW, borrow_limit=borrow_limit,
                preemption=PreemptionPolicy(within_quota=WithinQuota.LOWER_PRIORITY, reclaim=Reclaim.ANY),
                grace_period_s=grace_period_s, spare_finishing_within_s=spare_finishing_within_s,
            ))
            for size, count, interval, runtime, priority, request in KUEUE_BASELINE_SETS:
                for i in range(count):
                    jobs.append(TraceJob(
                        id=f"{name}-{size}-{i}", team=name, submit_time_s=round((i + 1) * interval, 6),
                        duration_s=runtime, gpus=request, priority=priority, size_class=size,
                    ))
        queues.append(Queue(name=f"cohort-{g}", capacity=capacity * quotas_per_group, quotas=tuple(quotas)))
    jobs.sort(key=lambda j: j.submit_time_s)
    return QuotaFile(queues=tuple(queues)), jobs
