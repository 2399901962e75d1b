"""The Backlog: waiting jobs per quota in queue order, kept up to date by a caller between cycles,
and a decision over it the same as over the plain list of the same jobs."""

from __future__ import annotations

import random

import pytest

from airflow_quota_provider.policy import State, decide
from airflow_quota_provider.policy.backlog import Backlog
from tests.policy.builders import pending, queue


def ids(backlog: Backlog, quota: str) -> list[str]:
    return [job.id for _, job in backlog.entries(quota)]


def test_each_quota_keeps_queue_order_as_jobs_come_and_go():
    backlog = Backlog([pending("late", "a", 1, 5, submitted_at=9.0), pending("low", "a", 1, 1)])
    backlog.add(pending("high", "a", 2, 9, submitted_at=20.0))
    backlog.add(pending("early", "a", 1, 5, submitted_at=3.0))
    backlog.add(pending("b1", "b", 1))
    assert ids(backlog, "a") == ["high", "early", "late", "low"]
    assert backlog.remove("early").id == "early"
    assert ids(backlog, "a") == ["high", "late", "low"]
    assert [job.id for job in backlog.in_queue_order()] == ["high", "late", "low", "b1"]
    assert "early" not in backlog and "late" in backlog and len(backlog) == 4


def test_the_figures_used_to_skip_a_quota_follow_removals():
    backlog = Backlog([pending("big", "a", 8, 9), pending("small", "a", 1, 1), pending("mid", "a", 4, 1)])
    assert (backlog.smallest("a"), backlog.largest("a"), backlog.highest_priority("a")) == (1, 8, 9)
    backlog.remove("big")
    backlog.remove("small")
    assert (backlog.smallest("a"), backlog.largest("a"), backlog.highest_priority("a")) == (4, 4, 1)
    backlog.remove("mid")
    assert backlog.quotas() == [] and backlog.entries("a") == []


def test_a_job_cannot_wait_twice():
    backlog = Backlog([pending("j1", "a", 1)])
    with pytest.raises(ValueError, match="job 'j1' is already waiting"):
        backlog.add(pending("j1", "b", 1))


def test_a_decision_over_a_kept_backlog_equals_one_over_the_list():
    state = (
        queue(8).quota("a", 4).quota("b", 4, max_priority=50)
        .run("b1", "b", 6, 0).run("a1", "a", 1, 3)
        .wait("a2", "a", 3, 9).wait("a3", "a", 2, 1, submitted_at=5.0).wait("b2", "b", 2, 60).wait("b3", "b", 1, 1)
        .build()
    )
    kept = Backlog()
    for job in reversed(state.pending):
        kept.add(job)
    over_backlog = decide(State(state.capacity, state.quotas, state.running, kept), 100.0)
    assert over_backlog.to_dict() == decide(state, 100.0).to_dict()
    assert over_backlog.reject and over_backlog.preempt and over_backlog.pending  # a case that shows something
    assert len(kept) == 4, "decide left the backlog as it was"


def test_without_explanations_the_same_jobs_start_and_stop():
    state = queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 8, 0).wait("a1", "a", 2, 9).wait("a2", "a", 4, 1).build()
    full, quiet = decide(state, 100.0), decide(state, 100.0, explain=False)
    assert (quiet.admit, quiet.preempt, quiet.reject) == (full.admit, full.preempt, full.reject)
    assert full.pending and not quiet.pending


def test_a_kept_backlogs_jobs_asking_for_one_type_are_those_jobs_sorted_afresh():
    rng = random.Random(5)
    kept = Backlog()
    for step in range(300):
        if step == 30:
            for gpu_type in ("h100", "a100"):
                kept.of_type(gpu_type)
        jobs = list(kept)
        if not jobs or rng.random() < 0.6:
            asked = rng.choice([(), ("h100",), ("a100",), ("a100", "h100")])
            kept.add(pending(f"j{step}", rng.choice("ab"), rng.choice([1, 2, 4]), rng.choice([0, 10]),
                             submitted_at=float(step), gpu_types=asked))
        else:
            kept.remove(rng.choice(jobs).id)
        if step >= 30:
            for gpu_type in ("h100", "a100"):
                afresh = Backlog(job for job in kept if job.gpu_types == (gpu_type,))
                by_type = kept.of_type(gpu_type)
                assert list(by_type.in_queue_order()) == list(afresh.in_queue_order()), (step, gpu_type)
                assert sorted((q, by_type.smallest(q), by_type.largest(q)) for q in by_type.quotas()) == sorted(
                    (q, afresh.smallest(q), afresh.largest(q)) for q in afresh.quotas())
