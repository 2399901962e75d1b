"""The orders of the policy, each one comparator ending on the job id (or host name) so it is total."""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter

from airflow_quota_provider.policy.jobs import Job


def queue_order(job: Job) -> tuple:
    """Order of waiting jobs: higher priority first, then earlier submission (FIFO), then id."""
    return (-job.priority, job.submitted_at, job.id)


def victim_order(job: Job, now: float) -> tuple:
    """Order of preemption candidates within one quota.

    1. lowest priority first;
    2. most recently started first (least progress lost, Kueue's rule);
    3. least work lost since the last checkpoint (GPU-seconds; all of its run time when it has none);
    4. id.
    Candidates of other quotas come before the preemptor's own; the search merges per-quota lists
    sorted by this key to get that.
    """
    started = job.started_at if job.started_at is not None else now
    since = job.last_checkpoint_at if job.last_checkpoint_at is not None else started
    return (job.priority, -started, job.gpus * max(0.0, now - since), job.id)


def victim_order_by_work(job: Job, now: float, finishing: bool) -> tuple:
    """Order of preemption candidates within one quota when the decision knows expected runtimes.

    1. lowest priority first;
    2. jobs expected to finish within their grace period first (waited for, they lose nothing);
    3. least run time lost: time since its last checkpoint in this run, or since it started;
    4. then :func:`victim_order`'s ties (most recently started, GPU-seconds lost, id).
    Without checkpoints, 3 is :func:`victim_order`'s "most recently started first"; a checkpoint
    older than the run's start saved nothing of this run.
    """
    started = job.started_at if job.started_at is not None else now
    return (job.priority, not finishing, now - saved_at(job, started), *victim_order(job, now)[1:])


def saved_at(job: Job, started: float) -> float:
    """Up to when the run of ``job`` that began at ``started`` has saved its work: its last checkpoint,
    unless that is older than the run (it saved nothing of it), else the start."""
    checkpoint = job.last_checkpoint_at
    return max(started, checkpoint) if checkpoint is not None else started


def victim_set_order(victims: list[Job], preemptor: Job, order: Callable[[Job], tuple]) -> tuple:
    """Order of victim sets found for different hosts: cheapest first.

    A victim's cost is its place in the victim search's order (:func:`victim_cost`, with the
    decision's ``order`` of candidates within a quota). A set's key is
    its victims' costs, costliest first, compared lexicographically: the set whose costliest victim
    comes earliest in that order wins, then the one whose next costliest does. A victim's cost ends on
    its id, so two keys tie only for the same victims (two hosts' sets may share the quota's victims).
    """
    return tuple(sorted((victim_cost(victim, preemptor, order) for victim in victims), reverse=True))


def victim_cost(victim: Job, preemptor: Job, order: Callable[[Job], tuple]) -> tuple:
    """A candidate's place in the victim search's order for ``preemptor``: other quotas' jobs first,
    then ``order`` (:func:`victim_order` or :func:`victim_order_by_work`)."""
    return (victim.quota == preemptor.quota, order(victim))


entry_key: Callable[[tuple[tuple, Job]], tuple] = itemgetter(0)
"""The key of a ``(key, job)`` entry of a list sorted by one of these orders (a C-level getter: the
replay sorts and searches millions of entries)."""
