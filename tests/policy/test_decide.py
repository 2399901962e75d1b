"""One table of cases per rule of DESIGN §2; each case is named after the rule it shows.

Each case gives a state, ``now`` and the expected admissions and preemptions (victim, preemptor,
reason); pending reasons are checked where the rule is about them. Every case also checks that the
input is left unchanged and that the decision is the same when asked twice.
"""

from __future__ import annotations

import copy

import pytest

from airflow_quota_provider.policy import State, decide
from tests.policy.builders import queue, with_priority


def victims(decision) -> list[tuple[str, str, str]]:
    return [(p.id, p.for_, p.reason) for p in decision.preempt]


def reason_of(decision, job_id: str) -> str:
    return next(p.reason for p in decision.pending if p.id == job_id)


def check(state: State, now: float, admit: list[str], preempt: list[tuple[str, str, str]]):
    before = copy.deepcopy(state)
    decision = decide(state, now)
    assert state == before, "the input was mutated"
    assert sorted(decision.admit) == sorted(admit), "-want,+got admit"
    assert victims(decision) == preempt, "-want,+got preempt"
    assert decide(state, now).to_dict() == decision.to_dict()
    decided = set(decision.admit) | {p.id for p in decision.pending} | {r.id for r in decision.reject}
    assert decided == {j.id for j in state.pending}, "every pending job is admitted, pending or rejected"
    return decision


ADMISSION = [
    pytest.param(
        queue(8).quota("a", 8).wait("j1", "a", 4).build(), ["j1"], [],
        id="admit a job that fits in its quota's unused capacity",
    ),
    pytest.param(
        queue(8).quota("a", 8).wait("j1", "a", 2).wait("j2", "a", 2).wait("j3", "a", 4).wait("j4", "a", 1).build(),
        ["j1", "j2", "j3"], [],
        id="admit as many jobs as fit in one cycle",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).wait("j1", "a", 6).build(), ["j1"], [],
        id="borrow idle capacity another quota lends",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, sharing="reserve").wait("j1", "a", 6).build(), [], [],
        id="a reserve quota never lends",
    ),
    pytest.param(
        queue(8).quota("a", 4, sharing="lend").quota("b", 4).wait("j1", "a", 6).build(), [], [],
        id="a lend quota never borrows",
    ),
    pytest.param(
        queue(16).quota("a", 4, borrow_limit=2).quota("b", 12).wait("j1", "a", 7).wait("j2", "a", 6).build(), ["j2"], [],
        id="borrow_limit caps what a quota uses above its capacity",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4, lend_limit=1).wait("j1", "a", 6).wait("j2", "a", 5).build(), ["j2"], [],
        id="lend_limit keeps the rest of a lender's capacity private",
    ),
    pytest.param(
        queue(10).quota("a", 4).quota("b", 4, sharing="reserve").wait("j1", "a", 6).build(), ["j1"], [],
        id="capacity no quota owns is a common pool any borrower may use",
    ),
    pytest.param(
        queue(8).quota("a", 8).wait("low", "a", 4, 1).wait("high", "a", 8, 9).build(), ["high"], [],
        id="higher priority is admitted first",
    ),
    pytest.param(
        queue(8).quota("a", 8).wait("later", "a", 8, 5, submitted_at=2).wait("first", "a", 8, 5, submitted_at=1).build(),
        ["first"], [],
        id="equal priority is first come first served",
    ),
    pytest.param(
        queue(8).quota("a", 8).run("r1", "a", 4, 9).wait("head", "a", 6, 9, submitted_at=1)
        .wait("behind", "a", 2, 9, submitted_at=2).build(),
        ["behind"], [],
        id="best-effort FIFO: a job behind a head that cannot start starts if it fits",
    ),
    pytest.param(
        queue(8).quota("a", 8).run("r1", "a", 4, 1).wait("head", "a", 8, 9).wait("behind", "a", 2, 5).build(),
        [], [("r1", "head", "within_quota")],
        id="best-effort FIFO: a job behind does not take the free capacity a head preempts for",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), ADMISSION)
def test_admission(state, admit, preempt):
    check(state, 100.0, admit, preempt)


RECLAIM = [
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 4, 5).run("b2", "b", 4, 5, started_at=10)
        .wait("a1", "a", 4, 1).build(),
        [], [("b2", "a1", "reclaim")],
        id="reclaim lent capacity from a borrower, most recently started first",
    ),
    pytest.param(
        queue(8).quota("a", 4, reclaim="never").quota("b", 4).run("b1", "b", 8, 5).wait("a1", "a", 4, 9).build(), [], [],
        id="reclaim never: the owner waits",
    ),
    pytest.param(
        queue(8).quota("a", 4, reclaim="lower_priority").quota("b", 4).run("b1", "b", 4, 7).run("b2", "b", 4, 9)
        .wait("a1", "a", 4, 5).build(),
        [], [],
        id="reclaim lower_priority spares a borrower of higher priority",
    ),
    pytest.param(
        queue(12).quota("a", 4).quota("b", 4).quota("c", 4).run("b1", "b", 4).run("c1", "c", 4, 5).run("c2", "c", 4, 1)
        .wait("a1", "a", 4, 9).build(),
        [], [("c2", "a1", "reclaim")],
        id="a quota within its capacity never loses a job to another quota",
    ),
    pytest.param(
        queue(12).quota("a", 4).quota("b", 4).quota("d", 4)
        .run("b1", "b", 2, 0).run("b2", "b", 4, 1).run("d1", "d", 2, 2).run("d2", "d", 4, 3)
        .wait("a1", "a", 4, 9).build(),
        [], [("b1", "a1", "reclaim"), ("d1", "a1", "reclaim")],
        id="a borrower stops being a reclaim candidate once back within its capacity",
    ),
    pytest.param(
        queue(8).quota("a", 4, within_quota="never").quota("b", 4).run("a1", "a", 2).run("b1", "b", 6, 0)
        .wait("a2", "a", 4, 9).build(),
        [], [],
        id="no reclaim for a job that would still borrow after it",
    ),
    pytest.param(
        # a_early meets quota a full (6 of 4) and is set aside; b1's reclaim brings a down to 2, so
        # a_late, after b1 in queue order, starts within a's capacity in the same pass.
        queue(8).quota("a", 4).quota("b", 4).run("A1", "a", 4, 0, started_at=10.0).run("A2", "a", 2, 0)
        .wait("a_early", "a", 1, 5, submitted_at=0.0).wait("b1", "b", 3, 5, submitted_at=1.0)
        .wait("a_late", "a", 2, 5, submitted_at=2.0).build(),
        ["a_late"], [("A1", "b1", "reclaim")],
        id="a quota set aside as full rejoins the within-quota pass once a reclaim brings it under its capacity",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), RECLAIM)
def test_reclaim(state, admit, preempt):
    check(state, 100.0, admit, preempt)


WITHIN_QUOTA = [
    pytest.param(
        queue(4).quota("a", 4).run("r1", "a", 4, 5).wait("p1", "a", 4, 6).build(), [], [("r1", "p1", "within_quota")],
        id="within_quota lower_priority preempts a strictly lower priority",
    ),
    pytest.param(
        queue(4).quota("a", 4).run("r1", "a", 4, 5, submitted_at=10).wait("p1", "a", 4, 5, submitted_at=1).build(), [], [],
        id="within_quota lower_priority spares an equal priority",
    ),
    pytest.param(
        queue(4).quota("a", 4, within_quota="lower_or_newer_equal_priority")
        .run("r1", "a", 4, 5, submitted_at=10).wait("p1", "a", 4, 5, submitted_at=1).build(),
        [], [("r1", "p1", "within_quota")],
        id="lower_or_newer_equal_priority preempts an equal priority submitted later",
    ),
    pytest.param(
        queue(4).quota("a", 4, within_quota="lower_or_newer_equal_priority")
        .run("r1", "a", 4, 5, submitted_at=0).wait("p1", "a", 4, 5, submitted_at=1).build(),
        [], [],
        id="lower_or_newer_equal_priority spares an equal priority submitted earlier",
    ),
    pytest.param(
        queue(4).quota("a", 4, within_quota="never").run("r1", "a", 4, 0).wait("p1", "a", 4, 9).build(), [], [],
        id="within_quota never",
    ),
    pytest.param(
        queue(8).quota("a", 8).run("v1", "a", 1, 1).run("v2", "a", 1, 2).run("v3", "a", 4, 3).run("keep", "a", 2, 9)
        .wait("p1", "a", 4, 5).build(),
        [], [("v3", "p1", "within_quota")],
        id="victims that are not needed are given back in reverse order",
    ),
    pytest.param(
        queue(8).quota("a", 8).run("v1", "a", 4, 1, started_at=1).run("v2", "a", 4, 1, started_at=2).wait("p1", "a", 4, 5).build(),
        [], [("v2", "p1", "within_quota")],
        id="most recently started is preempted first",
    ),
    pytest.param(
        queue(8).quota("a", 8).run("v1", "a", 4, 1, last_checkpoint_at=90).run("v2", "a", 4, 1, last_checkpoint_at=50)
        .wait("p1", "a", 4, 5).build(),
        [], [("v1", "p1", "within_quota")],
        id="least work lost since the last checkpoint is preempted first",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("a1", "a", 4, 1).run("b1", "b", 4, 0)
        .wait("p1", "a", 4, 5).build(),
        [], [("a1", "p1", "within_quota")],
        id="a job that cannot be within capacity with reclaim preempts in its own quota",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), WITHIN_QUOTA)
def test_within_quota(state, admit, preempt):
    check(state, 100.0, admit, preempt)


BORROWING = [
    pytest.param(
        queue(12).quota("a", 4, borrow_within=5).quota("b", 4).quota("c", 4, sharing="lend")
        .run("a1", "a", 4, 9).run("b1", "b", 4, 6).run("b2", "b", 2, 3).run("b3", "b", 2, 7).wait("p1", "a", 2, 8).build(),
        [], [("b2", "p1", "borrow_within")],
        id="borrow_within preempts low-priority jobs of another borrower while borrowing",
    ),
    pytest.param(
        queue(12).quota("a", 4).quota("b", 4).quota("c", 4, sharing="lend")
        .run("a1", "a", 4, 9).run("b1", "b", 4, 6).run("b2", "b", 2, 3).run("b3", "b", 2, 7).wait("p1", "a", 2, 8).build(),
        [], [],
        id="without borrow_within a borrowing job preempts nobody in other quotas",
    ),
    pytest.param(
        queue(12).quota("a", 4, borrow_within=2).quota("b", 4).quota("c", 4, sharing="lend")
        .run("a1", "a", 4, 9).run("b1", "b", 4, 6).run("b2", "b", 2, 3).run("b3", "b", 2, 7).wait("p1", "a", 2, 8).build(),
        [], [],
        id="borrow_within spares victims above its max_priority",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).run("a1", "a", 4, 0).wait("big", "a", 8, 9).build(), [], [],
        id="a job larger than its quota's capacity preempts nobody without borrow_within",
    ),
    pytest.param(
        queue(8).quota("a", 2, weight=1).quota("b", 2, weight=1).quota("c", 4, sharing="lend")
        .run("a1", "a", 4).wait("a2", "a", 2).wait("b1", "b", 4).build(),
        ["b1"], [],
        id="fair sharing: the quota borrowing least per weight borrows first",
    ),
    pytest.param(
        queue(8).quota("a", 2, weight=1).quota("b", 2, weight=4).quota("c", 4, sharing="lend")
        .run("a1", "a", 3).run("b1", "b", 4).wait("a2", "a", 1, submitted_at=0).wait("b2", "b", 1, submitted_at=5).build(),
        ["b2"], [],
        id="fair sharing weighs borrowed capacity by weight",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), BORROWING)
def test_borrowing(state, admit, preempt):
    check(state, 100.0, admit, preempt)


PROTECTION = [
    pytest.param(
        queue(4).quota("a", 4).run("r1", "a", 4, 0, preemptible=False).wait("p1", "a", 4, 9).build(), 100.0, [], [],
        id="a non-preemptible job is never a victim",
    ),
    pytest.param(
        queue(4).quota("a", 4, min_runtime_s=60).run("r1", "a", 4, 0, started_at=50).wait("p1", "a", 4, 9).build(), 100.0, [], [],
        id="min_runtime_s protects a job that started recently",
    ),
    pytest.param(
        queue(4).quota("a", 4, min_runtime_s=60).run("r1", "a", 4, 0, started_at=30).wait("p1", "a", 4, 9).build(), 100.0,
        [], [("r1", "p1", "within_quota")],
        id="after min_runtime_s the job may be preempted",
    ),
    pytest.param(
        queue(4).quota("a", 4).run("r1", "a", 4, 0, started_at=130).wait("p1", "a", 4, 9).build(), 100.0,
        [], [("r1", "p1", "within_quota")],
        id="without min_runtime_s a job stamped by a clock ahead (started in the future) may be preempted",
    ),
    pytest.param(
        queue(4).quota("a", 4, preemption_delay_s=30).run("r1", "a", 4, 0).wait("p1", "a", 4, 9, submitted_at=80).build(), 100.0,
        [], [],
        id="preemption_delay_s: a new job waits before it may preempt",
    ),
    pytest.param(
        queue(4).quota("a", 4, preemption_delay_s=30).run("r1", "a", 4, 0).wait("p1", "a", 4, 9, submitted_at=60).build(), 100.0,
        [], [("r1", "p1", "within_quota")],
        id="after preemption_delay_s the job may preempt",
    ),
    pytest.param(
        queue(4).quota("a", 4, max_preemptions=2, on_preemption_limit="protect")
        .run("r1", "a", 4, 0, preemptions=2).wait("p1", "a", 4, 9).build(), 100.0, [], [],
        id="on_preemption_limit protect: a job past its limit is no longer a candidate",
    ),
]


@pytest.mark.parametrize(("state", "now", "admit", "preempt"), PROTECTION)
def test_protection(state, now, admit, preempt):
    check(state, now, admit, preempt)


def test_preemption_limit_fails_the_victim_with_a_message_naming_the_limit():
    state = queue(4).quota("a", 4, max_preemptions=3).run("r1", "a", 4, 0, preemptions=3).wait("p1", "a", 4, 9).build()
    (preemption,) = check(state, 100.0, [], [("r1", "p1", "within_quota")]).preempt
    assert preemption.fail
    assert "max_preemptions is 3" in preemption.message and "preempted 4 times" in preemption.message


def test_preemption_below_the_limit_requeues():
    state = queue(4).quota("a", 4, max_preemptions=3).run("r1", "a", 4, 0, preemptions=2).wait("p1", "a", 4, 9).build()
    (preemption,) = check(state, 100.0, [], [("r1", "p1", "within_quota")]).preempt
    assert not preemption.fail and preemption.message == ""


def test_max_preemptions_zero_fails_on_the_first_preemption():
    state = queue(4).quota("a", 4).run("r1", "a", 4, 0, max_preemptions=0).wait("p1", "a", 4, 9).build()
    (preemption,) = check(state, 100.0, [], [("r1", "p1", "within_quota")]).preempt
    assert preemption.fail


def test_unset_max_preemptions_requeues_forever():
    state = queue(4).quota("a", 4).run("r1", "a", 4, 0, preemptions=1000).wait("p1", "a", 4, 9).build()
    (preemption,) = check(state, 100.0, [], [("r1", "p1", "within_quota")]).preempt
    assert not preemption.fail


def test_capacity_is_held_for_a_preemptor_until_its_victims_stop():
    state = (
        queue(8).quota("a", 4).quota("b", 4)
        .run("b1", "b", 4).run("b2", "b", 4, preempted_for="a1")
        .wait("a1", "a", 4, 9).wait("b3", "b", 1, 0).build()
    )
    decision = check(state, 100.0, [], [])
    assert reason_of(decision, "a1") == "waiting for preempted jobs to stop: b2"
    assert "full" in reason_of(decision, "b3")


def test_a_preemptor_waits_for_its_victims_even_when_other_gpus_are_free():
    state = (
        queue(8).quota("a", 4, sharing="reserve").quota("b", 4)
        .run("a1", "a", 4, 0).wait("p1", "a", 4, 9).wait("b1", "b", 4, 0).build()
    )
    decision = check(state, 100.0, ["b1"], [("a1", "p1", "within_quota")])
    assert reason_of(decision, "p1") == "waiting for preempted jobs to stop: a1"


def test_a_preemptor_starts_once_its_victims_have_stopped():
    state = queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 4).wait("a1", "a", 4, 9).wait("b3", "b", 4, 0).build()
    check(state, 100.0, ["a1"], [])


def test_a_preemptor_is_pending_in_the_same_cycle_with_its_victims_named():
    state = queue(4).quota("a", 4).run("r1", "a", 2, 0).run("r2", "a", 2, 0).wait("p1", "a", 4, 9).build()
    decision = check(state, 100.0, [], [("r1", "p1", "within_quota"), ("r2", "p1", "within_quota")])
    assert reason_of(decision, "p1") == "waiting for preempted jobs to stop: r1, r2"


def test_a_quotas_jobs_behind_one_held_for_its_victims_do_not_borrow():
    # a2 borrowing b's idle GPUs on top of a1's held 4 would leave a1 over its quota once a0 is gone:
    # it would preempt a2 (its own victim again) instead of starting.
    state = (
        queue(8).quota("a", 4).quota("b", 4)
        .run("a0", "a", 1, 0).run("b1", "b", 1).wait("a1", "a", 4, 9).wait("a2", "a", 1, 0).build()
    )
    decision = check(state, 100.0, [], [("a0", "a1", "within_quota")])
    assert reason_of(decision, "a2").endswith("; does not borrow while a1 of its quota waits for GPUs held for it")
    after = queue(8).quota("a", 4).quota("b", 4).run("b1", "b", 1).wait("a1", "a", 4, 9).wait("a2", "a", 1, 0).build()
    check(after, 101.0, ["a1", "a2"], [])


def test_jobs_of_other_quotas_still_borrow_while_a_job_is_held_for_its_victims():
    state = (
        queue(12).quota("a", 4).quota("b", 4).quota("c", 4)
        .run("a0", "a", 1, 0).run("b1", "b", 1).wait("a1", "a", 4, 9).wait("c1", "c", 6, 0).build()
    )
    check(state, 100.0, ["c1"], [("a0", "a1", "within_quota")])


def test_a_priority_update_changes_which_job_runs_next():
    state = queue(4).quota("a", 4).wait("first", "a", 4, 5, submitted_at=1).wait("second", "a", 4, 5, submitted_at=2).build()
    check(state, 100.0, ["first"], [])
    check(with_priority(state, "second", 6), 100.0, ["second"], [])


def test_a_priority_update_of_a_running_job_changes_who_is_preempted():
    state = queue(4).quota("a", 4).run("r1", "a", 2, 1).run("r2", "a", 2, 2).wait("p1", "a", 2, 9).build()
    check(state, 100.0, [], [("r1", "p1", "within_quota")])
    check(with_priority(state, "r1", 3), 100.0, [], [("r2", "p1", "within_quota")])


REJECTED = [
    pytest.param(
        queue(8).quota("a", 4, sharing="lend").quota("b", 4).wait("j1", "a", 5).build(),
        "asks for 5 GPUs; quota a can never hold more than 4",
        id="more GPUs than a non-borrowing quota's capacity",
    ),
    pytest.param(
        queue(8).quota("a", 2, borrow_limit=1).quota("b", 4).wait("j1", "a", 4).build(),
        "quota a can never hold more than 3",
        id="more GPUs than capacity plus borrow_limit",
    ),
    pytest.param(
        queue(8).quota("a", 2).quota("b", 6, sharing="reserve").wait("j1", "a", 3).build(),
        "quota a can never hold more than 2",
        id="more GPUs than others leave lendable",
    ),
    pytest.param(
        queue(8).quota("a", 8, max_priority=100).wait("j1", "a", 1, 101).build(),
        "priority 101 is above quota a's max_priority 100",
        id="priority above max_priority",
    ),
]


@pytest.mark.parametrize(("state", "reason"), REJECTED)
def test_rejected(state, reason):
    decision = check(state, 100.0, [], [])
    (rejection,) = decision.reject
    assert rejection.id == "j1" and reason in rejection.reason


def test_every_waiting_job_has_a_position_in_its_quota_and_a_reason():
    state = (
        queue(8).quota("a", 4).quota("b", 4, sharing="reserve")
        .run("a0", "a", 4, 50).run("b0", "b", 4, 50)
        .wait("a1", "a", 2, 10, submitted_at=1).wait("a2", "a", 2, 20, submitted_at=2).wait("b1", "b", 1, 5)
        .build()
    )
    decision = check(state, 100.0, [], [])
    assert [(p.id, p.position) for p in decision.pending] == [("a2", 1), ("a1", 2), ("b1", 1)]
    assert reason_of(decision, "a2").startswith("quota a full: 4/4 GPUs, needs 2")
    assert "cannot borrow (sharing reserve)" in reason_of(decision, "b1")
    assert "no preemptible jobs it may preempt would free 2 GPUs" in reason_of(decision, "a2")


def test_the_reason_names_the_borrower_holding_lent_capacity():
    state = queue(8).quota("a", 4, reclaim="never").quota("b", 4).run("b1", "b", 8, 90).wait("a1", "a", 4, 50).build()
    decision = check(state, 100.0, [], [])
    assert reason_of(decision, "a1") == (
        "quota a: 4 of 4 GPUs idle but lent, needs 4; b borrows 4, lowest preemptible priority 90; "
        "no preemptible jobs it may preempt would free 4 GPUs (within_quota lower_priority, reclaim never)"
    )


def test_the_reason_says_when_a_job_may_preempt():
    state = queue(4).quota("a", 4, preemption_delay_s=30).run("r1", "a", 4, 0).wait("p1", "a", 4, 9, submitted_at=80).build()
    decision = check(state, 100.0, [], [])
    assert reason_of(decision, "p1").endswith("may preempt in 10 s (preemption_delay_s 30)")
