"""The three policies a run compares, each one a quota file fed to the same ``policy.decide``.

Nothing here admits or preempts: the baselines are expressed as configurations of our own policy,
so that any difference in the figures comes from the configuration, not from a second scheduler.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from airflow_quota_provider.policy import PreemptionPolicy, Queue, Quota, QuotaFile, Reclaim, Sharing, WithinQuota
from airflow_quota_provider.policy.types import GpuType

POLICIES = ("quota", "static", "fifo")
NO_PREEMPTION = PreemptionPolicy(within_quota=WithinQuota.NEVER, reclaim=Reclaim.NEVER, borrow_within=None)


@dataclass(frozen=True)
class PolicySetup:
    """How one policy runs: the quota file ``decide`` sees and whether job priorities are kept."""

    name: str
    quota_file: QuotaFile
    equal_priority: bool
    """True: every job gets priority 0 (one FIFO order by submit time)."""
    fifo_quota: dict[str, str]
    """For ``fifo``: queue name -> the one quota every job of that queue runs on; else empty."""


def static_quota_file(quota_file: QuotaFile) -> QuotaFile:
    """Airflow pools today: each quota gets its own capacity and nothing else (no cohorts), and nobody is
    preempted."""
    def static(quotas: tuple[Quota, ...]) -> tuple[Quota, ...]:
        return tuple(
            replace(q, sharing=Sharing.RESERVE, borrow_limit=None, lend_limit=None, preemption=NO_PREEMPTION, cohort=None)
            for q in quotas
        )

    queues = tuple(
        replace(queue, cohorts=(), quotas=static(queue.quotas),
                types=tuple(replace(t, cohorts=(), quotas=static(t.quotas)) for t in queue.types))
        for queue in quota_file.queues
    )
    return QuotaFile(queues=queues)


def fifo_quota_file(quota_file: QuotaFile) -> QuotaFile:
    """One shared FIFO per job queue: a single quota of the whole capacity, no preemption."""
    def one(capacity: int, name: str) -> tuple[Quota, ...]:
        return (Quota(name=name, capacity=capacity, sharing=Sharing.RESERVE, preemption=NO_PREEMPTION),)

    queues = tuple(
        Queue(
            name=queue.name, capacity=queue.capacity, capacity_unit=queue.capacity_unit, quotas=one(queue.capacity, queue.name),
            types=tuple(GpuType(t.name, t.capacity, one(t.capacity, queue.name)) for t in queue.types),
            fungibility=queue.fungibility,
        )
        for queue in quota_file.queues
    )
    return QuotaFile(queues=queues)


def policy_setup(quota_file: QuotaFile, name: str) -> PolicySetup:
    if name == "quota":
        return PolicySetup(name, quota_file, equal_priority=False, fifo_quota={})
    if name == "static":
        return PolicySetup(name, static_quota_file(quota_file), equal_priority=False, fifo_quota={})
    if name == "fifo":
        return PolicySetup(name, fifo_quota_file(quota_file), equal_priority=True,
                           fifo_quota={q.name: q.name for q in quota_file.queues})
    raise ValueError(f"policy {name!r} is not one of {', '.join(POLICIES)}")
