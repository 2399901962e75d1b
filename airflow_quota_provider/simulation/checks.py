"""Checks every run makes on itself. A violation is a :class:`CheckError`, never a warning.

The engine checks as it goes that no queue (and, with hosts, no host) ever holds more GPUs than it
has, that the policy only admits waiting jobs and only preempts running ones, and that no job is left
waiting when nothing more can happen. After the run:

- **Conservation**: for each team, the GPU-seconds served (GPUs held minus work lost) equal the
  trace's ``duration_s * gpus`` over its completed jobs plus the saved progress of failed ones, and
  the GPU-time integrated per quota over time equals the sum over its jobs.
- **Zero wait**: where every quota (as the policy sees it) of a job queue has at least the peak
  zero-wait demand of its jobs, no job of that queue waits at all. Not with hosts: a job may then
  wait for a host with room while its quota has plenty (fragmentation is what such a run measures).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from airflow_quota_provider.policy import QuotaFile
from airflow_quota_provider.simulation.engine import CheckError, SimJob, SimulationResult
from airflow_quota_provider.simulation.policies import PolicySetup

_TOLERANCE = 1e-9


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= _TOLERANCE * max(1.0, abs(a), abs(b))


def check_conservation(result: SimulationResult) -> None:
    served: dict[str, float] = defaultdict(float)
    expected: dict[str, float] = defaultdict(float)
    held: dict[str, float] = defaultdict(float)
    for job in result.jobs:
        team = job.trace.team
        served[team] += job.busy - job.lost
        held[job.quota] += job.busy
        if job.status == "completed":
            expected[team] += job.trace.duration_s * job.trace.gpus
        elif job.status == "failed":
            expected[team] += (job.trace.duration_s - job.remaining) * job.trace.gpus
    for team in sorted(set(served) | set(expected)):
        if not _close(served[team], expected[team]):
            raise CheckError(f"{result.policy}: team {team} was served {served[team]:.3f} GPU-seconds, "
                             f"its trace asks for {expected[team]:.3f}")
    for name, usage in result.usage.items():
        if not _close(usage.busy_area, held[name]):
            raise CheckError(f"{result.policy}: quota {name} held {usage.busy_area:.3f} GPU-seconds over time, "
                             f"its jobs held {held[name]:.3f}")


def peak_demand(jobs: Iterable[SimJob]) -> int:
    """The most GPUs in use at once if every job started when submitted (ends before starts at a tie)."""
    events = []
    for job in jobs:
        events.append((job.trace.submit_time_s, 1, job.trace.gpus))
        events.append((job.trace.submit_time_s + job.trace.duration_s, 0, -job.trace.gpus))
    events.sort()
    peak = level = 0
    for _, _, delta in events:
        level += delta
        peak = max(peak, level)
    return peak


def check_zero_wait(result: SimulationResult, setup: PolicySetup, quota_file: QuotaFile) -> list[str]:
    """Raise if a queue with enough capacity everywhere saw a wait; returns the queues it applied to."""
    if result.placed:
        return []
    policy_quota: dict[str, str] = {}
    for queue in quota_file.queues:
        for quota in queue.quotas:
            policy_quota[quota.name] = setup.fifo_quota.get(queue.name, quota.name)
    jobs_by_policy_quota: dict[str, list[SimJob]] = defaultdict(list)
    for job in result.jobs:
        jobs_by_policy_quota[policy_quota[job.quota]].append(job)
    applied = []
    for queue in setup.quota_file.queues:
        if all(peak_demand(jobs_by_policy_quota[q.name]) <= q.capacity for q in queue.quotas):
            applied.append(queue.name)
            for quota in queue.quotas:
                for job in jobs_by_policy_quota[quota.name]:
                    if job.status != "rejected" and (job.wait != 0 or job.preemptions):
                        raise CheckError(
                            f"{result.policy}: job {job.trace.id!r} waited {job.wait:g} s (preempted "
                            f"{job.preemptions} times) though every quota of queue {queue.name} has at least "
                            f"its peak demand"
                        )
    return applied


def run_checks(result: SimulationResult, setup: PolicySetup, quota_file: QuotaFile) -> dict[str, object]:
    check_conservation(result)
    applied = check_zero_wait(result, setup, quota_file)
    return {"conservation": "passed", "zero_wait_queues": applied}
