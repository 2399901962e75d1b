"""The executor keeps each job queue's backlog between cycles instead of sorting ten thousand
waiting jobs again every cycle: whatever the jobs did between two cycles (arrived, started, changed
priority, left), the kept backlog must be the one a fresh sort gives."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from airflow_quota_provider.executors.schedule import _backlog
from airflow_quota_provider.policy import Job
from airflow_quota_provider.policy.backlog import Backlog

QUOTAS = ("a", "b", "c")

jobs = st.builds(
    lambda i, quota, gpus, priority, at: Job(id=str(i), quota=quota, gpus=gpus, priority=priority, submitted_at=at),
    st.integers(0, 40),
    st.sampled_from(QUOTAS),
    st.integers(1, 4),
    st.integers(0, 3),
    st.floats(0, 10),
)


def _listing(backlog: Backlog) -> tuple:
    per_quota = tuple((q, tuple(j for _, j in backlog.entries(q))) for q in QUOTAS)
    sizes = tuple(
        (q, backlog.smallest(q), backlog.largest(q), backlog.highest_priority(q)) for q in QUOTAS if backlog.entries(q)
    )
    return tuple(backlog.in_queue_order()), per_quota, sizes, len(backlog)


@given(st.lists(jobs, max_size=40), st.lists(st.tuples(st.lists(jobs, max_size=6), st.sets(st.integers(0, 40))), max_size=6))
def test_a_backlog_kept_between_cycles_equals_a_fresh_one(first, changes):
    """Each cycle after the first adds or changes a few jobs and drops a few, as between two
    heartbeats (a few changes take the in-place path, many a fresh sort)."""
    pending = {job.id: job for job in first}
    kept = _backlog(None, pending)
    for arrived, left in changes:
        pending = {i: job for i, job in pending.items() if int(i) not in left} | {job.id: job for job in arrived}
        kept = _backlog(kept, pending)
        assert _listing(kept) == _listing(Backlog(pending.values()))


def test_a_changed_job_replaces_its_old_entry():
    old = Job(id="1", quota="a", gpus=1, priority=1, submitted_at=0.0)
    other = Job(id="2", quota="a", gpus=1, priority=5, submitted_at=1.0)
    many = {str(i): Job(id=str(i), quota="b", gpus=1, priority=0, submitted_at=2.0 + i) for i in range(3, 20)}
    kept = _backlog(None, {"1": old, "2": other, **many})
    raised = replace(old, priority=9)
    kept = _backlog(kept, {"1": raised, "2": other, **many})
    assert [j for _, j in kept.entries("a")] == [raised, other]
    assert kept.get("1") is raised
