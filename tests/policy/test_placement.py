"""Host placement (DESIGN §2, hosts): one table of cases per rule, each case named after its rule.

A case gives a state with hosts and the expected admissions (job -> host) and preemptions (victim,
preemptor, reason); ``check`` also asserts that the input is unchanged, that the decision is the
same when asked twice, and that every pending job is admitted, pending or rejected.
"""

from __future__ import annotations

import pytest

from tests.policy.builders import queue
from tests.policy.test_decide import check, reason_of


def placed(state, admit: dict[str, str], preempt: list[tuple[str, str, str]]):
    decision = check(state, 100.0, list(admit), preempt)
    assert decision.hosts == admit, "-want,+got hosts"
    return decision


ADMISSION = [
    pytest.param(
        queue(12).quota("a", 12).host("h1", 4).host("h2", 4).host("h3", 4)
        .run("r1", "a", 1, host="h1").run("r3", "a", 2, host="h3").wait("j4", "a", 4).build(),
        {"j4": "h2"}, [],
        id="a 4-GPU job lands only on a host with 4 free GPUs, never split",
    ),
    pytest.param(
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("r1", "a", 2, host="h1").run("r2", "a", 2, host="h2").wait("j4", "a", 4).build(),
        {}, [],
        id="4 free GPUs in all, 2 on each host: a 4-GPU job waits",
    ),
    pytest.param(
        queue(20).quota("a", 20).host("h1", 8).host("h2", 4).host("h3", 8)
        .run("r1", "a", 4, host="h1").run("r2", "a", 1, host="h2").wait("j3", "a", 3).build(),
        {"j3": "h2"}, [],
        id="best fit: the job goes to the host it fills best",
    ),
    pytest.param(
        queue(20).quota("a", 20).host("h1", 8).host("h2", 4).host("h3", 8)
        .run("r1", "a", 4, host="h1").run("r2", "a", 1, host="h2")
        .wait("j8", "a", 8, 3).wait("j4", "a", 4, 2).wait("j3", "a", 3, 1).build(),
        {"j8": "h3", "j4": "h1", "j3": "h2"}, [],
        id="best fit counts the jobs admitted earlier in the same cycle",
    ),
    pytest.param(
        queue(8).quota("a", 8).host("h2", 4).host("h1", 4).wait("j2", "a", 2).build(),
        {"j2": "h1"}, [],
        id="best fit ties go to the first host by name",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), ADMISSION)
def test_admission(state, admit, preempt):
    placed(state, admit, preempt)


def test_a_job_that_finds_no_host_waits_with_a_reason_that_names_fragmentation():
    """With hosts of 4+4 GPUs and 3+3 in use, a 2-GPU job waits (its quota has room: not "quota full")."""
    state = (
        queue(8).quota("a", 4).quota("b", 4)
        .host("gpu-a", 4).host("gpu-b", 4)
        .run("r1", "a", 3, 9, host="gpu-a").run("r2", "b", 3, 9, host="gpu-b")
        .wait("j2", "a", 2, 5).build()
    )
    decision = placed(state, {}, [])
    assert reason_of(decision, "j2") == (
        "no host has 2 free GPUs (fragmented: largest free block 1 GPU on gpu-a; hosts gpu-a 3/4, gpu-b 3/4 in use); "
        "no preemptible jobs it may preempt would free 2 GPUs on one host (within_quota lower_priority, reclaim any)"
    )


def test_a_job_that_finds_no_host_while_a_host_is_lost_says_how_few_gpus_are_left():
    state = (
        queue(12).quota("a", 12).host("h1", 4).host("h2", 4)
        .run("r1", "a", 2, 9, host="h1").run("r2", "a", 4, 9, host="h2").wait("j4", "a", 4, 5).build()
    )
    decision = placed(state, {}, [])
    assert reason_of(decision, "j4").startswith(
        "no host has 4 free GPUs (2 GPUs free on all hosts together; largest free block 2 GPUs on h1; "
        "hosts h1 2/4, h2 4/4 in use)"
    )


PREEMPTION = [
    pytest.param(
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("v1", "a", 2, 1, host="h1").run("k1", "a", 2, 9, host="h1")
        .run("v2", "a", 2, 1, host="h2").run("k2", "a", 2, 9, host="h2")
        .wait("p", "a", 4, 5).build(),
        {}, [],
        id="two victims on two hosts do not make room for a 4-GPU job on either",
    ),
    pytest.param(
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("v1", "a", 2, 1, host="h1").run("v2", "a", 2, 1, host="h1", started_at=5)
        .run("v3", "a", 2, 1, host="h2", started_at=9).run("k2", "a", 2, 9, host="h2")
        .wait("p", "a", 4, 5).build(),
        {}, [("v2", "p", "within_quota"), ("v1", "p", "within_quota")],
        id="the host whose candidates make room",
    ),
    pytest.param(
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("x", "a", 4, 3, host="h1").run("y", "a", 2, 1, host="h2").run("z", "a", 2, 2, host="h2")
        .wait("p", "a", 4, 5).build(),
        {}, [("y", "p", "within_quota"), ("z", "p", "within_quota")],
        id="the host whose victims cost least is chosen: two at priorities 1 and 2 before one at 3",
    ),
    pytest.param(
        # On h1 the reclaim of b2 is not enough and a's own a1 must go too; on h2 b1 alone makes room.
        queue(8).quota("a", 6).quota("b", 2).host("h1", 4).host("h2", 4)
        .run("a1", "a", 2, 1, host="h1").run("b2", "b", 2, 1, host="h1").run("b1", "b", 4, 5, host="h2")
        .wait("p", "a", 4, 5).build(),
        {}, [("b1", "p", "reclaim")],
        id="the host whose victims cost least is chosen: another quota's job before the preemptor's own",
    ),
    pytest.param(
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("r1", "a", 3, 1, host="h1").run("r2", "a", 3, 1, host="h2").wait("p", "a", 2, 5).build(),
        {}, [("r1", "p", "within_quota")],
        id="a job that fits its quota but no host preempts to make room on one host",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), PREEMPTION)
def test_preemption(state, admit, preempt):
    placed(state, admit, preempt)


# The quota arithmetic is queue-wide: victims it needs may be on any host, and only the room the job
# needs on its host may ask for more.
VICTIMS_ACROSS_HOSTS = [
    pytest.param(
        # The fleet: c reserves 2 GPUs it does not use, so a may have 2 of the 4 free ones and
        # reclaims 2 of b's; the idle h2 has room for it.
        queue(10).quota("a", 4).quota("b", 4).quota("c", 2, sharing="reserve")
        .host("h1", 4).host("h2", 4).host("h3", 2)
        .run("b1", "b", 1, host="h1", started_at=1).run("b2", "b", 1, host="h1", started_at=2)
        .run("b3", "b", 1, host="h1", started_at=3).run("b4", "b", 1, host="h1", started_at=4)
        .run("b5", "b", 1, host="h3", started_at=5).run("b6", "b", 1, host="h3", started_at=6)
        .wait("p", "a", 4, 50, preemptible=False).build(),
        "h2", [("b6", "p", "reclaim"), ("b5", "p", "reclaim")],
        id="a reclaim takes the victims its quota needs and goes to the idle host, not every job on a full host",
    ),
    pytest.param(
        # a needs 2 of b's GPUs back (c's free one is not lent); h1 has 1 free and b1, so p waits on h1
        # and b2 on h2 goes for the quota.
        queue(8).quota("a", 3).quota("b", 4).quota("c", 1, sharing="reserve")
        .host("h1", 4).host("h2", 4)
        .run("b1", "b", 1, host="h1", started_at=2).run("a1", "a", 1, 9, host="h1").run("kb1", "b", 1, host="h1", preemptible=False)
        .run("b2", "b", 1, host="h2", started_at=9).run("kb2", "b", 3, host="h2", preemptible=False)
        .wait("p", "a", 2, 5).build(),
        "h1", [("b2", "p", "reclaim"), ("b1", "p", "reclaim")],
        id="the quota needs a victim on another host than the one with room",
    ),
    pytest.param(
        # b3 alone brings b back within its capacity, and frees 2 GPUs on h2 where k stays: room for p
        # is on h1, where both of b's jobs must go; then b3 is not needed.
        queue(8).quota("a", 4).quota("b", 4)
        .host("h1", 4).host("h2", 4)
        .run("b1", "b", 2, host="h1", started_at=1).run("b2", "b", 2, host="h1", started_at=2)
        .run("b3", "b", 2, host="h2", started_at=3).run("k", "b", 2, host="h2", preemptible=False)
        .wait("p", "a", 4, 50).build(),
        "h1", [("b2", "p", "reclaim"), ("b1", "p", "reclaim")],
        id="placement forces victims on the host with room, and the quota's cheaper victim elsewhere is not taken",
    ),
]


def test_a_victim_of_the_preemptors_own_quota_is_only_taken_on_the_host_it_will_run_on():
    """Freed on another host, a1 could borrow its way back in at once while p waited (the Kueue-shape
    replay preempted and re-admitted such jobs forever at one instant): p borrows the idle GPU instead."""
    state = (
        queue(8).quota("a", 4).quota("b", 4).host("h1", 4).host("h2", 4)
        .run("a1", "a", 1, 1, host="h1").run("k", "b", 3, 9, host="h1", preemptible=False)
        .wait("p", "a", 4, 5).build()
    )
    placed(state, {"p": "h2"}, [])


@pytest.mark.parametrize(("state", "host", "preempt"), VICTIMS_ACROSS_HOSTS)
def test_victims_across_hosts(state, host, preempt):
    decision = placed(state, {}, preempt)
    assert reason_of(decision, "p").endswith(f"GPUs on {host} are held for it"), reason_of(decision, "p")


def test_a_preemptor_waits_on_its_victims_host_with_its_gpus_held_there():
    state = (
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("v1", "a", 2, 1, host="h1").run("v2", "a", 2, 1, host="h1", started_at=5).run("k2", "a", 2, 9, host="h2")
        .wait("p", "a", 4, 5).wait("q", "a", 2, 0).build()
    )
    decision = placed(state, {"q": "h2"}, [("v2", "p", "within_quota"), ("v1", "p", "within_quota")])
    assert reason_of(decision, "p") == "waiting for preempted jobs to stop: v2, v1; its 4 GPUs on h1 are held for it"


def test_a_held_jobs_gpus_on_its_victims_host_are_not_given_to_another_job():
    """v1 has stopped, v2 still stops: h1 has 2 GPUs free, but p waits for them and v2's; q may not
    take them although its quota has room (a 4-GPU host of the 12-GPU queue is lost)."""
    state = (
        queue(12).quota("a", 6).quota("b", 6).host("h1", 4).host("h2", 4)
        .run("v2", "a", 2, 1, host="h1", preempted_for="p").run("b1", "b", 4, host="h2")
        .wait("p", "a", 4, 9).wait("q", "b", 2, 0).build()
    )
    decision = placed(state, {}, [])
    assert reason_of(decision, "p") == "waiting for preempted jobs to stop: v2; its 4 GPUs on h1 are held for it"
    assert reason_of(decision, "q").startswith("no host has 2 free GPUs (0 GPUs free on all hosts together; every host is full")


def test_gpus_a_stopping_victim_does_not_owe_its_preemptor_are_free_for_others():
    state = (
        queue(8).quota("a", 4).quota("b", 4).host("h1", 8)
        .run("v", "a", 4, 1, host="h1", preempted_for="p").wait("p", "a", 4, 9).wait("q", "b", 4, 0).build()
    )
    placed(state, {"q": "h1"}, [])


def test_a_job_that_fits_its_quota_waits_for_stopping_jobs_on_a_host_rather_than_preempting_more():
    # w stops for a job that is gone; once it has, h1 has room for p, so k on h2 is spared.
    state = (
        queue(8).quota("a", 8).host("h1", 4).host("h2", 4)
        .run("w", "a", 4, 0, host="h1", preempted_for="gone").run("k", "a", 4, 0, host="h2")
        .wait("p", "a", 4, 9).build()
    )
    decision = placed(state, {}, [])
    assert reason_of(decision, "p") == "waiting for stopping jobs to release GPUs on h1: needs 4, 0 free there; its capacity is held"


def test_a_job_larger_than_the_largest_host_is_rejected_naming_both_sizes():
    state = queue(16).quota("a", 16).host("h1", 8).host("h2", 8).wait("j16", "a", 16).wait("j8", "a", 8).build()
    decision = placed(state, {"j8": "h1"}, [])
    assert [(r.id, r.reason) for r in decision.reject] == [("j16", "asks for 16 GPUs; the largest host of this job queue has 8")]


def test_the_decision_says_where_each_admitted_job_starts():
    state = queue(8).quota("a", 8).host("h1", 4).host("h2", 4).run("r", "a", 3, host="h1").wait("j1", "a", 1).wait("j2", "a", 4).build()
    assert placed(state, {"j1": "h1", "j2": "h2"}, []).to_dict()["admit"] == [{"id": "j1", "host": "h1"}, {"id": "j2", "host": "h2"}]


def test_without_hosts_admit_is_a_list_of_ids():
    decision = check(queue(8).quota("a", 8).wait("j1", "a", 4).build(), 100.0, ["j1"], [])
    assert decision.hosts == {} and decision.to_dict()["admit"] == ["j1"]


DOWN_HOSTS = [
    pytest.param(
        queue(12).quota("a", 12).host("h1", 4, down=True).host("h2", 4).host("h3", 4)
        .run("r3", "a", 3, host="h3").wait("j4", "a", 4).build(),
        {"j4": "h2"}, [],
        id="nothing starts on a host that is down",
    ),
    pytest.param(
        queue(12).quota("a", 12).host("h1", 8, down=True).host("h2", 4).wait("j8", "a", 8).build(),
        {}, [],
        id="a job only a down host can hold waits for it instead of being rejected",
    ),
    pytest.param(
        queue(8).quota("a", 4).quota("b", 4).host("h1", 4, down=True).host("h2", 4)
        .run("rb1", "b", 4, host="h1").run("rb2", "b", 4, host="h2").wait("ja", "a", 4, 50).build(),
        {}, [("rb2", "ja", "reclaim")],
        id="victims are never chosen on a host that is down",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), DOWN_HOSTS)
def test_down_hosts(state, admit, preempt):
    decision = placed(state, admit, preempt)
    assert not decision.reject
    for pending in decision.pending:
        assert "down" in pending.reason or "waiting for preempted jobs" in pending.reason, pending.reason
