"""One predicate per preemption policy value: may ``preemptor`` take ``candidate``'s GPUs?

Each function answers for one rule of DESIGN §2 and nothing else; the candidate search combines them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.vocabulary import OnPreemptionLimit, Reclaim, WithinQuota

# Members read once here: on Python 3.11 each ``Enum.MEMBER`` read goes through the enum metaclass's
# ``__getattr__`` hook (~50 ns), and these rules are asked millions of times in a replay.
_LOWER_PRIORITY, _LOWER_OR_NEWER_EQUAL_PRIORITY = WithinQuota.LOWER_PRIORITY, WithinQuota.LOWER_OR_NEWER_EQUAL_PRIORITY
_RECLAIM_ANY, _RECLAIM_LOWER_PRIORITY = Reclaim.ANY, Reclaim.LOWER_PRIORITY
_PROTECT = OnPreemptionLimit.PROTECT


def within_quota_allows(policy: WithinQuota, preemptor: Job, candidate: Job) -> bool:
    """``within_quota``: victims in the preemptor's own quota."""
    if policy == _LOWER_PRIORITY:
        return candidate.priority < preemptor.priority
    if policy == _LOWER_OR_NEWER_EQUAL_PRIORITY:
        return candidate.priority < preemptor.priority or (
            candidate.priority == preemptor.priority and candidate.submitted_at > preemptor.submitted_at
        )
    return False  # never


# Victims in other quotas are allowed up to a priority ceiling (None: any priority, -inf: none), so
# the search can stop scanning a list sorted by ascending priority at the first one above it.
NOBODY = float("-inf")


def reclaim_ceiling(policy: Reclaim, priority: int) -> float | None:
    """``reclaim``: victims in other quotas that run above their capacity, to win back lent capacity
    (for a preemptor of ``priority``)."""
    if policy == _RECLAIM_ANY:
        return None
    if policy == _RECLAIM_LOWER_PRIORITY:
        return priority - 1
    return NOBODY  # never


def may_reclaim_from(lender: Quota, job: Job) -> bool:
    """Whether ``lender``'s reclaim rule lets one of its jobs (at most its ``max_priority``) preempt
    ``job``, which borrows from it: what the UI marks as a reclaim candidate."""
    if lender.max_priority is None:
        return lender.preemption.reclaim != Reclaim.NEVER
    ceiling = reclaim_ceiling(lender.preemption.reclaim, lender.max_priority)
    return ceiling is None or job.priority <= ceiling


def borrow_within_ceiling(max_priority: int | None, priority: int) -> float:
    """``borrow_within``: lower-priority victims (at most ``max_priority``) in other borrowing quotas,
    while the preemptor's own quota (its priority: ``priority``) keeps borrowing."""
    if max_priority is None:
        return NOBODY
    return min(priority - 1, max_priority)


def effective_max_preemptions(job: Job, quota: Quota) -> int | None:
    return job.max_preemptions if job.max_preemptions is not None else quota.max_preemptions


def limit_reached(job: Job, quota: Quota) -> bool:
    """The job has used up its preemption retries: one more preemption is past the limit."""
    limit = effective_max_preemptions(job, quota)
    return limit is not None and job.preemptions >= limit


def stoppable(job: Job) -> bool:
    """What a running job says of itself for :func:`may_be_preempted`: preemptible, not already stopping."""
    return job.preemptible and job.preempted_for is None


def may_be_preempted(job: Job, quota: Quota, now: float) -> bool:
    """A running job is a candidate at all: :func:`stoppable`, past ``min_runtime_s``, and not
    protected by ``on_preemption_limit: protect`` once its retries are used up."""
    if not stoppable(job):
        return False
    min_runtime = min_runtime_of(job, quota)
    # Without a minimum a job is a candidate however its start time compares with now (a start
    # stamped by a clock ahead of this one lies in the future).
    if min_runtime > 0 and job.started_at is not None and now - job.started_at < min_runtime:
        return False
    return not (quota.on_preemption_limit == _PROTECT and limit_reached(job, quota))


def spares_none(quota: Quota) -> bool:
    """Whether ``quota``'s own rules spare none of its stoppable jobs: :func:`may_be_preempted` is then
    :func:`stoppable` at any ``now`` for each of them without a ``min_runtime_s`` of its own."""
    return quota.min_runtime_s <= 0 and quota.on_preemption_limit != "protect"


def may_preempt(job: Job, quota: Quota, now: float) -> bool:
    """A waiting job may cause preemption once it has waited ``preemption_delay_s``."""
    return now - job.submitted_at >= quota.preemption_delay_s


def min_runtime_of(job: Job, quota: Quota) -> float:
    """How long the job runs before it may be preempted: its own ``min_runtime_s``, else its quota's."""
    return job.min_runtime_s if job.min_runtime_s is not None else quota.min_runtime_s


def next_timer(running: Iterable[Job], pending: Iterable[Job], quotas: Mapping[str, Quota], now: float) -> float:
    """The next moment after ``now`` when a time-based rule may let a waiting job through though
    nothing else changed (inf: none): a running job passing its ``min_runtime_s``, or a waiting one its
    quota's ``preemption_delay_s``. The replay and the start forecast decide again then."""
    wake = math.inf
    for job in running:
        if job.preempted_for is None:
            at = job.started_at + min_runtime_of(job, quotas[job.quota])
            if at > now:
                wake = min(wake, at)
    for job in pending:
        at = job.submitted_at + quotas[job.quota].preemption_delay_s
        if at > now:
            wake = min(wake, at)
    return wake


def grace_period_of(job: Job, quota: Quota) -> float:
    """How long the job may take to stop once preempted: its own grace period, else its quota's (for
    the policy's jobs and the executor's rows alike)."""
    return job.grace_period_s if job.grace_period_s is not None else quota.grace_period_s


def finishes_within_grace(job: Job, quota: Quota, now: float) -> bool:
    """A running job expected to end on its own before a preemption's grace period would: stopping it
    frees its GPUs no sooner and loses its work, so the search waits for it instead. Its quota's
    ``spare_finishing_within_s``, when longer, widens that window: its owner accepts that preemptors
    wait up to that long rather than make a job about to finish lose its run.

    A job already past its expected end (the estimate was short) is spared for its quota's
    ``spare_finishing_within_s`` more, then treated as one of unknown runtime: it may be preempted. So
    a wrong estimate delays a reclaim by at most the window before the end plus that one after it (by
    the grace period alone with the default 0, as without the estimate). Estimates are noisy: a job
    just past one is more often about to end than not, and its owner's window says how long it is worth
    waiting for.
    """
    if job.expected_runtime_s is None or job.started_at is None:
        return False
    end = job.started_at + job.expected_runtime_s
    spare = quota.spare_finishing_within_s
    window = grace_period_of(job, quota)
    if spare > window:
        window = spare
    return end - window <= now < end + spare
