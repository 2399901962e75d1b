"""Figures of a run, per quota and overall, in the report's JSON shape.

Definitions (all times in seconds, GPU-hours = GPU-seconds / 3600):

- ``jobs``: jobs submitted; ``completed``, ``rejected`` (the policy said it can never run) and
  ``failed`` (preempted past its ``max_preemptions``) split them. With hosts,
  ``rejected_larger_than_host`` counts the rejected jobs that ask for more GPUs than a host has (those
  no hosts can hold as a gang); ``gang_jobs`` those that ran as gangs, ``gang_wait_mean_s`` their mean wait.
- ``gpu_hours``: useful work served, lost work excluded.
- ``utilisation``: per quota, the time-average of ``min(GPUs its jobs hold, capacity) / capacity``
  (0-1; what it holds above its capacity is ``borrowed_gpu_hours``); overall, GPUs held / the pool's
  capacity. Both over the run's span, first submission to last job end.
- ``wait_*``: time a job spent waiting between its submission and its end, summed over its attempts
  (a preempted job waits again from its stop). Jobs that never ran (rejected) have no wait.
  Percentiles are nearest-rank: the smallest wait with at least p % of the waits at or below it.
- ``in_quota_wait_p95_s``: the waits of jobs that fit within their quota when they arrived: its
  GPUs in use plus the GPUs of its jobs already waiting plus the job's own at most its capacity.
- ``reclaim_latency_p95_s``: for those in-quota jobs that found too few free GPUs in the pool
  (so others were using capacity this quota lends), submission to first start.
- ``used_within_gpu_hours``, ``lent_gpu_hours``, ``idle_gpu_hours`` (per quota), and
  ``borrowed_gpu_hours``, ``lost_gpu_hours``: as :mod:`airflow_quota_provider.policy.accounting`
  defines them for the live system (``airflow quota usage``), over the run's span.
- ``preemptions``, ``lost_gpu_hours``: preemptions of this quota's jobs and the work they lost
  (run time since the last checkpoint); GPUs held during a grace period count as busy.
- ``makespan_s``: from the run's first submission to the end of the quota's (or the run's) last job.
Figures without samples (a quota that had no preemption-free wait to measure) are ``null``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from airflow_quota_provider.policy.accounting import account
from airflow_quota_provider.simulation.engine import SimJob, SimulationResult

METRIC_KEYS = (
    "jobs", "gpu_hours", "utilisation", "wait_mean_s", "wait_p50_s", "wait_p95_s", "wait_p99_s",
    "in_quota_wait_p95_s", "borrowed_gpu_hours", "preemptions", "lost_gpu_hours", "reclaim_latency_p95_s",
    "makespan_s",
)


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of ``values`` (need not be sorted); None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return ordered[rank - 1]


def _r(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits) + 0.0


def _summary(jobs: list[SimJob], start: float, placed: bool) -> dict[str, Any]:
    ran = [j for j in jobs if j.first_start is not None]
    waits = [j.wait for j in ran]
    in_quota = [j.wait for j in ran if j.in_quota]
    reclaim = [j.first_start - j.trace.submit_time_s for j in ran if j.reclaim]
    ends = [j.end for j in jobs if j.end is not None]
    rejected = [j for j in jobs if j.status == "rejected"]
    figures = {
        "jobs": len(jobs),
        "completed": sum(1 for j in jobs if j.status == "completed"),
        "rejected": len(rejected),
        "failed": sum(1 for j in jobs if j.status == "failed"),
        "gpu_hours": _r(sum(j.busy - j.lost for j in jobs) / 3600.0),
        "wait_mean_s": _r(sum(waits) / len(waits)) if waits else None,
        "wait_p50_s": _r(percentile(waits, 50)),
        "wait_p95_s": _r(percentile(waits, 95)),
        "wait_p99_s": _r(percentile(waits, 99)),
        "in_quota_jobs": sum(1 for j in jobs if j.in_quota),
        "in_quota_wait_p95_s": _r(percentile(in_quota, 95)),
        "reclaim_jobs": len(reclaim),
        "reclaim_latency_p95_s": _r(percentile(reclaim, 95)),
        "preemptions": sum(j.preemptions for j in jobs),
        "lost_gpu_hours": _r(sum(j.lost for j in jobs) / 3600.0),
        "makespan_s": _r(max(ends) - start) if ends else None,
    }
    if placed:
        figures["rejected_larger_than_host"] = sum(1 for j in rejected if j.trace.gpus > j.queue.largest_host)
        gangs = [j.wait for j in ran if j.job.nodes > 1]
        figures["gang_jobs"] = len(gangs)
        figures["gang_wait_mean_s"] = _r(sum(gangs) / len(gangs)) if gangs else None
    return figures


def summarize(result: SimulationResult) -> dict[str, Any]:
    """``{"overall": {...}, "quotas": {name: {...}}, "by_priority": {...}, "by_size_class": {...}}``, and
    ``"cohorts": {name: {...}}`` (the same figures over each cohort's subtree) when the file has cohorts."""
    span = result.end - result.start
    by_quota: dict[str, list[SimJob]] = {name: [] for name in result.quota_names}
    for job in result.jobs:
        by_quota[job.quota].append(job)
    quotas = {name: _usage_figures(jobs, result.usage[name], result, span) for name, jobs in by_quota.items()}
    if span > 0 and result.quota_file is not None:
        charged = account(result.quota_file.queues, result.holds, [(result.start, result.end)])
        for name, figures in quotas.items():
            charge = charged.quotas[(result.start, name)]
            figures["utilisation"] = _r(charge.used_within / charge.capacity_s) if charge.capacity_s else None
            figures["borrowed_gpu_hours"] = _r(charge.borrowed / 3600.0)
            figures["used_within_gpu_hours"] = _r(charge.used_within / 3600.0)
            figures["lent_gpu_hours"] = _r(charge.lent / 3600.0)
            figures["idle_gpu_hours"] = _r(charge.idle / 3600.0)
    overall = _summary(result.jobs, result.start, result.placed)
    overall["capacity"] = result.capacity
    busy = sum(u.busy_area for u in result.usage.values())
    overall["utilisation"] = _r(busy / (result.capacity * span)) if span > 0 else None
    overall["borrowed_gpu_hours"] = _r(sum(u.over_area for u in result.usage.values()) / 3600.0)
    report: dict[str, Any] = {
        "overall": _ordered(overall),
        "quotas": quotas,
        "by_priority": _groups(result.jobs, lambda j: str(j.trace.priority if j.trace.priority is not None else 0)),
        "decisions": result.decisions,
    }
    if result.cohorts:
        report["cohorts"] = {
            name: _usage_figures([job for q in result.cohort_quotas[name] for job in by_quota[q]], usage, result, span)
            for name, usage in result.cohorts.items()
        }
    if any(j.trace.size_class for j in result.jobs):
        report["by_size_class"] = _groups(result.jobs, lambda j: j.trace.size_class or "-")
    return report


def _usage_figures(jobs: list[SimJob], usage: Any, result: SimulationResult, span: float) -> dict[str, Any]:
    """A quota's or a cohort's figures: its jobs', and its GPUs in use over time against its capacity
    (a cohort's: what its subtree owns; borrowed: used above it)."""
    figures = _summary(jobs, result.start, result.placed)
    figures["capacity"] = usage.capacity
    figures["utilisation"] = _r(usage.in_area / (usage.capacity * span)) if usage.capacity and span > 0 else None
    figures["borrowed_gpu_hours"] = _r(usage.over_area / 3600.0)
    return _ordered(figures)


def _groups(jobs: Iterable[SimJob], key) -> dict[str, Any]:
    groups: dict[str, list[SimJob]] = {}
    for job in jobs:
        groups.setdefault(key(job), []).append(job)
    out = {}
    for name in sorted(groups, key=lambda k: (len(k), k)):
        members = groups[name]
        waits = [j.wait for j in members if j.first_start is not None]
        out[name] = {
            "jobs": len(members),
            "rejected": sum(1 for j in members if j.status == "rejected"),
            "wait_mean_s": _r(sum(waits) / len(waits)) if waits else None,
            "wait_p95_s": _r(percentile(waits, 95)),
            "preemptions": sum(j.preemptions for j in members),
        }
    return out


def _ordered(figures: dict[str, Any]) -> dict[str, Any]:
    """The issue's keys first, in its order, then the extra ones."""
    out = {key: figures[key] for key in METRIC_KEYS}
    out.update((k, v) for k, v in figures.items() if k not in out)
    return out
