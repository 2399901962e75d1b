"""Expected runtimes in the victim search (DESIGN §2, expected runtime): a victim about to finish is
waited for, victims that lose least work go first, and without runtimes nothing changes.

Quotas default to a 120 s grace period; ``now`` is 100 in every case.
"""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_quota_provider.policy import PolicyError, State, decide, parse_state
from tests.policy.builders import queue
from tests.policy.test_properties import NOW, balanced, host_states, logical_end, states

# Runs 50 s from its start at 0: ends at 150, within the 120 s grace period of a preemption at 100.
ABOUT_TO_FINISH = {"started_at": 0.0, "expected_runtime_s": 150.0}
# Ends at 10,000, long after the grace period.
LONG = {"started_at": 0.0, "expected_runtime_s": 10_000.0}


def check(state: State, admit: list[str], preempt: list[str], awaits: dict[str, list[str]]):
    before = copy.deepcopy(state)
    decision = decide(state, NOW)
    assert state == before, "the input was mutated"
    assert sorted(decision.admit) == sorted(admit), "-want,+got admit"
    assert [p.id for p in decision.preempt] == preempt, "-want,+got preempt"
    assert {p.id: p.awaits for p in decision.pending if p.awaits} == awaits, "-want,+got awaits"
    assert decide(state, NOW).to_dict() == decision.to_dict()
    return decision


RUNTIMES = [
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 4, 5, **ABOUT_TO_FINISH).run("b2", "b", 4, 5, **LONG)
        .wait("a1", "a", 4, 1).build(),
        [], [], {"a1": ["b1"]},
        id="a victim about to finish is spared and waited for",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 8, 5, **LONG).wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="reclaim still meets the grace bound when a victim is long",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 8, 5, grace_period_s=30.0, **ABOUT_TO_FINISH)
        .wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="a victim is spared only if it finishes within its own grace period, not its quota's",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0).run("b1", "b", 8, 5, grace_period_s=60.0, **ABOUT_TO_FINISH)
        .wait("a1", "a", 4, 1).build(),
        [], [], {"a1": ["b1"]},
        id="a victim whose own grace period is longer than its quota's is spared within it",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0, spare_finishing_within_s=60.0)
        .run("b1", "b", 8, 5, **ABOUT_TO_FINISH).wait("a1", "a", 4, 1).build(),
        [], [], {"a1": ["b1"]},
        id="a victim ending within its quota's spare_finishing_within_s, past its grace period, is waited for",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0, spare_finishing_within_s=40.0)
        .run("b1", "b", 8, 5, **ABOUT_TO_FINISH).wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="a victim ending after both its grace period and spare_finishing_within_s is preempted",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0, spare_finishing_within_s=10_000.0)
        .run("b1", "b", 8, 5, started_at=0.0).wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="spare_finishing_within_s spares no victim without an expected runtime",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 2, 5, **ABOUT_TO_FINISH).run("b2", "b", 2, 5, **LONG)
        .run("b3", "b", 4, 5, started_at=0.0, expected_runtime_s=20_000.0).wait("a1", "a", 4, 1).build(),
        [], ["b2"], {"a1": ["b1"]},
        id="the long victims are preempted and the one about to finish is waited for, together in one grace period",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 4, 5, started_at=0.0, expected_runtime_s=90.0)
        .run("b2", "b", 4, 5, **LONG).wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="a job past its expected end is preempted like one of unknown runtime",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0, spare_finishing_within_s=60.0)
        .run("b1", "b", 4, 5, started_at=0.0, expected_runtime_s=90.0).run("b2", "b", 4, 5, **LONG)
        .wait("a1", "a", 4, 1).build(),
        [], [], {"a1": ["b1"]},
        id="a job past its expected end by less than its quota's spare_finishing_within_s is still waited for",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0, spare_finishing_within_s=60.0)
        .run("b1", "b", 4, 5, started_at=0.0, expected_runtime_s=40.0).run("b2", "b", 4, 5, **LONG)
        .wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="a job past its expected end by spare_finishing_within_s is preempted: a short estimate delays it once",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4)
        .run("b1", "b", 4, 5, started_at=0.0, last_checkpoint_at=95.0, expected_runtime_s=10_000.0)
        .run("b2", "b", 4, 5, started_at=50.0, expected_runtime_s=10_000.0).wait("a1", "a", 4, 1).build(),
        [], ["b1"], {},
        id="with runtimes the victim losing least work since its checkpoint goes first",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4)
        .run("b1", "b", 4, 5, started_at=0.0, last_checkpoint_at=95.0).run("b2", "b", 4, 5, started_at=50.0)
        .wait("a1", "a", 4, 1).build(),
        [], ["b2"], {},
        id="without runtimes the most recently started victim goes first, as before",
    ),
    pytest.param(
        queue(8).quota("a", 8).run("low1", "a", 4, 1, **ABOUT_TO_FINISH).run("low2", "a", 4, 1, started_at=60.0)
        .wait("high", "a", 4, 9).build(),
        [], [], {"high": ["low1"]},
        id="within a quota a lower-priority job about to finish is waited for",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 4, 9, **ABOUT_TO_FINISH).run("b2", "b", 4, 1, **LONG)
        .wait("a1", "a", 4, 1).build(),
        [], ["b2"], {},
        id="priority still comes first: a lower-priority long victim goes before a higher one about to finish",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt", "awaits"), RUNTIMES)
def test_runtimes(state, admit, preempt, awaits):
    check(state, admit, preempt, awaits)


def test_the_waiting_reason_names_the_spared_job_and_when_it_is_expected_to_end():
    state = RUNTIMES[0].values[0]
    reason = next(p.reason for p in decide(state, NOW).pending if p.id == "a1")
    assert "waiting for b1 (expected to end in 50 s) to finish on its own (spared, not preempted)" in reason


def test_the_waiting_reason_says_a_spared_job_has_outlived_its_estimate():
    state = (
        queue(8).quota("a", 4).quota("b", 4, grace_period_s=30.0, spare_finishing_within_s=60.0)
        .run("b1", "b", 4, 5, started_at=0.0, expected_runtime_s=90.0).run("b2", "b", 4, 5, **LONG)
        .wait("a1", "a", 4, 1).build()
    )
    reason = next(p.reason for p in decide(state, NOW).pending if p.id == "a1")
    assert "waiting for b1 (past its expected end by 10 s) to finish on its own" in reason


def test_a_spared_job_holds_its_capacity_for_the_preemptor_against_later_jobs():
    state = (
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 4, 5, **ABOUT_TO_FINISH).run("b2", "b", 4, 5, **LONG)
        .wait("a1", "a", 4, 1, submitted_at=1.0).wait("a2", "a", 4, 1, submitted_at=2.0).build()
    )
    decision = check(state, [], [], {"a1": ["b1"]})
    assert "waiting for" not in next(p.reason for p in decision.pending if p.id == "a2")


def test_the_decision_file_reads_expected_runtime_and_rejects_a_negative_one():
    document = {
        "now": 100, "capacity": 4, "quotas": [{"name": "a", "capacity": 4}],
        "running": [{"id": "r", "quota": "a", "gpus": 4, "priority": 0, "started_at": 0, "submitted_at": 0,
                     "expected_runtime_s": 150}],
        "pending": [{"id": "p", "quota": "a", "gpus": 4, "priority": 9, "submitted_at": 1, "expected_runtime_s": None}],
    }
    state, _ = parse_state(document)
    assert state.running[0].expected_runtime_s == 150.0 and state.pending[0].expected_runtime_s is None
    document["running"][0]["expected_runtime_s"] = -1
    with pytest.raises(PolicyError, match=r"running\[0\]\.expected_runtime_s"):
        parse_state(document)


def _with_runtimes(state: State, runtime_of) -> State:
    return replace(state, running=tuple(replace(job, expected_runtime_s=runtime_of(job)) for job in state.running))


@st.composite
def contested_states(draw) -> State:
    """A full queue whose borrowers and low-priority jobs are reclaim and within-quota candidates of
    the waiting jobs: most examples preempt (the general generators rarely do)."""
    within = draw(st.sampled_from(["never", "lower_priority", "lower_or_newer_equal_priority"]))
    builder = queue(16).quota("a", 8, within_quota=within).quota("b", 8, within_quota=within)
    used = 0
    for index in range(draw(st.integers(1, 10))):
        gpus = draw(st.integers(1, 4))
        if used + gpus > 16:
            break
        used += gpus
        # "a" within its capacity, "b" borrowing the rest
        name = "a" if used <= 4 else "b"
        builder.run(f"r{index}", name, gpus, draw(st.integers(0, 2)), started_at=float(draw(st.integers(0, 99))),
                    submitted_at=float(draw(st.integers(0, 99))))
    for index in range(draw(st.integers(1, 3))):
        builder.wait(f"p{index}", draw(st.sampled_from("ab")), draw(st.integers(1, 8)), draw(st.integers(0, 3)),
                     submitted_at=float(draw(st.integers(0, 99))))
    return builder.build()


@settings(max_examples=200)
@given(st.one_of(contested_states(), states(), states(tree=True), host_states()))
def test_runtimes_that_spare_nobody_decide_exactly_as_without_runtimes(state):
    """The unchanged path (no runtimes) against the runtime-aware one where no victim is about to
    finish and no job has a checkpoint: the same admissions, victims, reasons and positions."""
    assert all(job.last_checkpoint_at is None for job in state.running)
    long = _with_runtimes(state, lambda job: 1e9)
    assert decide(long, NOW).to_dict() == decide(state, NOW).to_dict()


@settings(max_examples=200)
@given(st.one_of(contested_states(), states()), st.data())
def test_a_job_about_to_finish_is_never_preempted_and_capacity_holds_once_the_awaited_end(state, data):
    runtimes = _with_runtimes(state, lambda job: data.draw(st.sampled_from([None, 10.0, 60.0, 150.0, 300.0])))
    decision = decide(runtimes, NOW)
    quotas = {q.name: q for q in state.quotas}
    by_id = {job.id: job for job in runtimes.running}
    awaited = [job_id for p in decision.pending for job_id in p.awaits]
    assert len(awaited) == len(set(awaited)), "a job is waited for by one preemptor at most"
    for job_id in [p.id for p in decision.preempt] + awaited:
        job = by_id[job_id]
        finishing = job.expected_runtime_s is not None and NOW < job.started_at + job.expected_runtime_s <= NOW + (
            job.grace_period_s if job.grace_period_s is not None else quotas[job.quota].grace_period_s)
        assert finishing == (job_id in awaited), job
    assert balanced(logical_end(runtimes, decision), quotas, state.capacity, cohorts=state.cohorts)  # awaited ended
