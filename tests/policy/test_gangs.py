"""Gangs (multi-host jobs, issue 32): one table of cases per rule, each case named after its rule.

A gang of ``nodes`` nodes asks for ``gpus`` GPUs on each of as many different hosts, counts all of
them against its quota, is admitted all or nothing and preempted as one victim. ``placed`` checks
the admissions with their hosts (a gang's as a list, node 0's first) and the preemptions.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_quota_provider.policy import State, decide, parse_state
from airflow_quota_provider.policy.errors import PolicyError
from tests.policy.builders import queue
from tests.policy.builders import queue as queue_of
from tests.policy.test_decide import check, reason_of


def placed(state, admit: dict[str, str | list[str]], preempt: list[tuple[str, str, str]]):
    decision = check(state, 100.0, list(admit), preempt)
    assert decision.hosts == admit, "-want,+got hosts"
    return decision


ADMISSION = [
    pytest.param(
        queue(24).quota("a", 24).host("h1", 8).host("h2", 8).host("h3", 8).wait_gang("g", "a", 8, 2).build(),
        {"g": ["h1", "h2"]}, [],
        id="a gang starts with one node on each of as many different hosts",
    ),
    pytest.param(
        queue(24).quota("a", 24).host("h1", 8).host("h2", 8).host("h3", 8)
        .run("r1", "a", 2, host="h1").run("r2", "a", 2, host="h2").wait_gang("g", "a", 8, 2).build(),
        {}, [],
        id="all or nothing: one host with room for a node of two is no start",
    ),
    pytest.param(
        queue(24).quota("a", 24).host("h1", 8).host("h2", 8).host("h3", 8)
        .run("r1", "a", 4, host="h2").run("r3", "a", 2, host="h3").wait_gang("g", "a", 4, 2).build(),
        {"g": ["h2", "h3"]}, [],
        id="the fullest hosts first: those its nodes fill best",
    ),
    pytest.param(
        queue(32).quota("a", 32)
        .host("h1", 8, rack="r1").host("h2", 8, rack="r2").host("h3", 8, rack="r1").host("h4", 8, rack="r2")
        .run("r1", "a", 2, host="h1").run("r2", "a", 1, host="h2").wait_gang("g", "a", 6, 2).build(),
        {"g": ["h1", "h3"]}, [],
        id="a gang's nodes share a rack when a rack has room for all of them",
    ),
    pytest.param(
        queue(32).quota("a", 32)
        .host("h1", 8, rack="r1", zone="z1").host("h2", 8, rack="r2", zone="z2")
        .host("h3", 8, rack="r3", zone="z1").host("h4", 8, rack="r4", zone="z2")
        .run("r1", "a", 2, host="h2").wait_gang("g", "a", 6, 2).build(),
        {"g": ["h2", "h4"]}, [],
        id="no rack has room for every node: the zone they leave fullest, before hosts across zones",
    ),
    pytest.param(
        queue(24).quota("a", 24).host("h1", 8).host("h2", 8).host("h3", 8)
        .wait_gang("g1", "a", 8, 2, 5).wait_gang("g2", "a", 8, 2, 4).wait("s", "a", 8, 3).build(),
        {"g1": ["h1", "h2"], "s": "h3"}, [],
        id="two gangs never split the fleet between them: the second waits whole",
    ),
    pytest.param(
        queue(16).quota("a", 8).quota("b", 8).host("h1", 8).host("h2", 8).wait_gang("g", "a", 6, 2).build(),
        {"g": ["h1", "h2"]}, [],
        id="a gang counts every node's GPUs against its quota: 12 of 8 is borrowing",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), ADMISSION)
def test_admission(state, admit, preempt):
    placed(state, admit, preempt)


PREEMPTION = [
    pytest.param(
        queue(16).quota("a", 8).quota("b", 8).host("h1", 8).host("h2", 8)
        .run_gang("bg", "b", 8, ["h1", "h2"]).wait("a1", "a", 8, 5).build(),
        {}, [("bg", "a1", "reclaim")],
        id="a gang victim is one preemption that stops every node",
    ),
    pytest.param(
        queue(16).quota("a", 8).quota("b", 8).host("h1", 8).host("h2", 8)
        .run("b1", "b", 4, 0, host="h1").run("b2", "b", 4, 1, host="h1").run("b3", "b", 4, 2, host="h2")
        .run("b4", "b", 4, 3, host="h2").wait_gang("ag", "a", 4, 2, 5).build(),
        {}, [("b1", "ag", "reclaim"), ("b3", "ag", "reclaim")],
        id="a gang reclaims on as many hosts as it has nodes, the fewest victims the arithmetic needs",
    ),
    pytest.param(
        queue(24).quota("a", 8).quota("b", 16).host("h1", 8).host("h2", 8).host("h3", 8)
        .run("a1", "a", 8, 0, host="h1").run("b1", "b", 8, host="h2").wait_gang("ag", "a", 4, 2, 5).build(),
        {}, [("a1", "ag", "within_quota")],
        id="a gang's own quota's victim is on one of its hosts",
    ),
]


@pytest.mark.parametrize(("state", "admit", "preempt"), PREEMPTION)
def test_preemption(state, admit, preempt):
    placed(state, admit, preempt)


def test_a_gangs_victims_free_a_host_for_each_node_and_it_waits_there_with_its_gpus_held():
    state = (
        queue(16).quota("a", 8).quota("b", 8).host("h1", 8).host("h2", 8)
        .run("b1", "b", 4, 0, host="h1").run("b2", "b", 4, 1, host="h1").run("b3", "b", 4, 2, host="h2")
        .run("b4", "b", 4, 3, host="h2").wait_gang("ag", "a", 4, 2, 5).wait("b5", "b", 4, 0).build()
    )
    decision = placed(state, {}, [("b1", "ag", "reclaim"), ("b3", "ag", "reclaim")])
    assert reason_of(decision, "ag") == (
        "waiting for preempted jobs to stop: b1, b3; its 4 GPUs on each of h1, h2 are held for it"
    )


def test_a_job_on_one_host_preempts_its_own_quotas_gang_and_waits_on_one_of_its_hosts():
    state = (
        queue(16).quota("a", 8).quota("b", 8).host("h1", 8).host("h2", 8)
        .run_gang("ag0", "a", 4, ["h1", "h2"], 0).run("b1", "b", 4, host="h1").run("b2", "b", 4, host="h2")
        .wait("a1", "a", 4, 5).build()
    )
    decision = placed(state, {}, [("ag0", "a1", "within_quota")])
    assert reason_of(decision, "a1") == "waiting for preempted jobs to stop: ag0; its 4 GPUs on h1 are held for it"


def test_a_gang_starts_once_its_victims_are_gone():
    state = (
        queue(16).quota("a", 8).quota("b", 8).host("h1", 8).host("h2", 8)
        .run("b2", "b", 4, 1, host="h1").run("b4", "b", 4, 3, host="h2").wait_gang("ag", "a", 4, 2, 5).build()
    )
    placed(state, {"ag": ["h1", "h2"]}, [])


def test_a_gang_that_finds_too_few_hosts_says_how_many_have_room():
    state = (
        queue(24).quota("a", 24, within_quota="never").host("h1", 8).host("h2", 8).host("h3", 8)
        .run("r1", "a", 2, host="h1").run("r2", "a", 2, host="h2").wait_gang("g", "a", 8, 2).build()
    )
    decision = placed(state, {}, [])
    assert reason_of(decision, "g").startswith("needs 2 hosts with 8 GPUs free, 1 has (h3)")


def test_a_gang_larger_than_the_fleet_is_rejected_naming_hosts_and_gpus():
    state = queue(24).quota("a", 24).host("h1", 8).host("h2", 8).host("h3", 4).wait_gang("g", "a", 8, 3).build()
    (rejection,) = decide(state, 0.0).reject
    assert rejection.reason == "asks for 3 hosts with 8 GPUs each; this job queue has 2 hosts of at least 8 GPUs"


def test_a_gang_is_never_rejected_for_being_larger_than_one_host():
    state = queue(24).quota("a", 24).host("h1", 8).host("h2", 8).host("h3", 8).wait_gang("g", "a", 8, 3).build()
    assert decide(state, 0.0).admit == ["g"]


def test_without_hosts_a_gang_is_its_gpus_in_all():
    state = queue(16).quota("a", 16).wait_gang("g", "a", 8, 2).wait("s", "a", 1).build()
    assert decide(state, 0.0).admit == ["g"]


def _file(running=(), pending=(), hosts=({"name": "h1", "gpus": 8}, {"name": "h2", "gpus": 8}, {"name": "h3", "gpus": 8})):
    return {
        "now": 100, "capacity": 24, "quotas": [{"name": "a", "capacity": 20}, {"name": "b", "capacity": 4}],
        "hosts": list(hosts), "running": list(running), "pending": list(pending),
    }


def test_the_decision_file_takes_gpus_per_host_and_nodes_and_answers_with_every_nodes_host():
    state, now = parse_state(_file(
        running=[{"id": "bg", "quota": "b", "gpus": 4, "nodes": 2, "hosts": ["h2", "h3"], "priority": 0,
                  "submitted_at": 0, "started_at": 0}],
        pending=[{"id": "ag", "quota": "a", "gpus": 8, "nodes": 2, "priority": 1, "submitted_at": 0}],
    ))
    (bg,) = state.running
    assert (bg.gpus, bg.nodes, bg.host, bg.hosts) == (8, 2, "h2", ("h2", "h3"))
    assert decide(state, now).to_dict()["preempt"][0]["id"] == "bg"
    state, now = parse_state(_file(pending=[{"id": "ag", "quota": "a", "gpus": 8, "nodes": 2, "priority": 1, "submitted_at": 0}]))
    assert decide(state, now).to_dict()["admit"] == [{"id": "ag", "host": "h1", "hosts": ["h1", "h2"]}]


@pytest.mark.parametrize(("job", "path", "message"), [
    ({"nodes": 2, "hosts": ["h1"]}, "running[0].hosts", "1 hosts for 2 nodes (one host per node)"),
    ({"nodes": 2, "hosts": ["h1", "h1"]}, "running[0].hosts[1]", "host h1 twice"),
    ({"nodes": 2, "hosts": ["h1", "h9"]}, "running[0].hosts[1]", "'h9' is not one of the hosts: h1, h2, h3"),
    ({"nodes": 2, "host": "h1"}, "running[0].host", "a job of 2 nodes gives hosts (one per node), not host"),
    ({"nodes": 0, "host": "h1"}, "running[0].nodes", "0 is below the minimum 1"),
    ({"nodes": 1025, "host": "h1"}, "running[0].nodes", "1025 is above the maximum 1024 hosts of one job"),
    ({"nodes": 2, "hosts": ["h1", "h2"], "gpus": 5}, "running[1].hosts", "host h1 has 8 GPUs; its running jobs hold 9"),
])
def test_a_bad_gang_in_a_decision_file_is_refused_naming_the_field(job, path, message):
    entry = {"id": "r", "quota": "a", "gpus": 4, "priority": 0, "submitted_at": 0, "started_at": 0, **job}
    other = {"id": "o", "quota": "a", "gpus": 4, "priority": 0, "submitted_at": 0, "started_at": 0, "host": "h1"}
    with pytest.raises(PolicyError) as raised:
        parse_state(_file(running=[other, entry] if job.get("gpus") == 5 else [entry]))
    assert raised.value.path == path and message in raised.value.message, str(raised.value)


# Hosts kept for a gang that has waited (gang_reservation_after_s): four hosts of 4 with 3, 3, 2 and 2
# free; the gang (quota a, 2 nodes of 4) fits its quota but no hosts, and no rule gives it victims
# (a never reclaims what b borrows, nor does c); a job of quota c asks for 3.
def _fragmented(gang_submitted_at: float = 0.0, **queue):
    state = (
        queue_of(16).quota("a", 8, reclaim="never").quota("b", 4).quota("c", 4, reclaim="never")
        .host("h1", 4).host("h2", 4).host("h3", 4).host("h4", 4)
        .run("r1", "b", 1, host="h1").run("r2", "b", 1, host="h2").run("r3", "b", 2, host="h3").run("r4", "b", 2, host="h4")
        .wait_gang("g", "a", 4, 2, 5, submitted_at=gang_submitted_at).wait("s", "c", 3, 1, submitted_at=50.0)
        .build()
    )
    return replace(state, **queue)


def test_without_gang_reservation_after_s_other_jobs_take_the_hosts_a_gang_waits_for():
    decision = placed(_fragmented(gang_reservation_after_s=None, gang_submitted_at=-1e6), {"s": "h1"}, [])
    assert "kept for it" not in reason_of(decision, "g")


def test_by_default_a_gang_that_has_waited_a_day_gets_hosts_kept():
    assert "kept for it" not in reason_of(placed(_fragmented(gang_submitted_at=100.0 - 86_399), {"s": "h1"}, []), "g")
    assert "waited over 86400 s" in reason_of(placed(_fragmented(gang_submitted_at=100.0 - 86_400), {}, []), "g")


def test_a_gang_waiting_gang_reservation_after_s_gets_the_hosts_nearest_to_room_kept_and_nothing_else_starts_there():
    decision = placed(_fragmented(gang_reservation_after_s=100.0), {}, [])  # waited 100 s at now=100
    assert reason_of(decision, "g") == (
        "waited over 100 s (gang_reservation_after_s) with no 2 hosts of 4 free GPUs: h1, h2 are kept for it, "
        "and it starts once their running jobs end (h1, h2 still busy); nothing else starts there")
    assert "no host has 3 free GPUs" in reason_of(decision, "s")


def _with_runtimes(state, **runtimes):
    """``state`` with these expected runtimes (job id -> seconds) on its jobs, running or waiting."""
    known = lambda job: replace(job, expected_runtime_s=runtimes.get(job.id, job.expected_runtime_s))  # noqa: E731
    return replace(state, running=tuple(map(known, state.running)), pending=tuple(map(known, state.pending)))


def test_with_expected_runtimes_the_hosts_expected_to_have_room_first_are_kept_not_the_most_free():
    # h3 and h4 (2 free) have room for a node once r3 and r4 end at 300 and 400; h1 and h2 (3 free) at 1000 and 2000.
    state = _with_runtimes(_fragmented(gang_reservation_after_s=100.0), r1=1000, r2=2000, r3=300, r4=400)
    decision = placed(state, {"s": "h1"}, [])  # the hosts not kept are free for anyone
    assert reason_of(decision, "g") == (
        "waited over 100 s (gang_reservation_after_s) with no 2 hosts of 4 free GPUs: h3, h4 are kept for it, "
        "and it starts once their running jobs end (h3, h4 still busy, expected in 300 s by their expected runtimes); "
        "only jobs expected to end before then start there")


# Backfill: four hosts of 4 with 2, 2, 1 and 1 free, kept for the gang (quota a, 2 nodes of 4) h1 and
# h2, expected to have room at 300 and 400; the queue's capacity (20) leaves 2 GPUs beyond the gang's
# 8, which s (quota c, 2 GPUs) may take; only h1 and h2 have room for it.
def _backfill(**runtimes):
    state = (
        queue_of(20).quota("a", 8, reclaim="never").quota("b", 8).quota("c", 4, reclaim="never")
        .host("h1", 4).host("h2", 4).host("h3", 4).host("h4", 4)
        .run("r1", "b", 2, host="h1").run("r2", "b", 2, host="h2").run("r3", "b", 3, host="h3").run("r4", "b", 3, host="h4")
        .wait_gang("g", "a", 4, 2, 5).wait("s", "c", 2, 1, submitted_at=50.0).wait("t", "c", 2, 1, submitted_at=60.0)
        .build()
    )
    return _with_runtimes(replace(state, gang_reservation_after_s=100.0), **{"r1": 300, "r2": 400, "r3": 1000, "r4": 2000, **runtimes})


def test_a_job_expected_to_end_before_the_kept_hosts_have_room_starts_there_and_delays_the_gang_by_nothing():
    decision = placed(_backfill(s=250), {"s": "h1"}, [])
    assert "h1, h2 are kept for it" in reason_of(decision, "g") and "expected in 300 s" in reason_of(decision, "g")
    # The next cycle, with s on h1 until 350: the same hosts are kept, expected to have room at the same time.
    state = _backfill()
    s = next(job for job in state.pending if job.id == "s")
    state = replace(state, pending=tuple(job for job in state.pending if job.id != "s"),
                    running=(*state.running, replace(s, started_at=100.0, host="h1", expected_runtime_s=250.0)))
    decision = check(state, 110.0, [], [])
    assert "h1, h2 are kept for it" in reason_of(decision, "g") and "expected in 290 s" in reason_of(decision, "g")


@pytest.mark.parametrize("runtime", [350.0, None], ids=["ends after the kept hosts have room", "runtime unknown"])
def test_a_job_not_known_to_end_before_the_kept_hosts_have_room_does_not_start_there(runtime):
    decision = placed(_backfill(s=runtime), {}, [])
    assert "no host has 2 free GPUs" in reason_of(decision, "s")


def test_a_job_whose_start_would_leave_the_gang_short_of_its_quota_does_not_start_on_the_kept_hosts():
    # s and t both end in time, but after s the queue has just the gang's 8 GPUs left.
    decision = placed(_backfill(s=250, t=250), {"s": "h1"}, [])
    assert "no host has 2 free GPUs" in reason_of(decision, "t")


def test_a_gang_that_has_not_waited_gang_reservation_after_s_keeps_no_hosts():
    placed(_fragmented(gang_submitted_at=1.0, gang_reservation_after_s=100.0), {"s": "h1"}, [])


def test_hosts_are_kept_for_one_gang_a_cycle():
    state = _fragmented(gang_reservation_after_s=100.0)
    second = replace(state.pending[0], id="g2", priority=4)
    decision = placed(replace(state, pending=(*state.pending, second)), {}, [])
    assert "are kept for it" in reason_of(decision, "g") and "are kept for it" not in reason_of(decision, "g2")


def test_hosts_are_kept_for_the_gang_that_has_waited_longest_not_the_first_in_queue_order():
    # g2 comes first (priority 9), but g has waited longer: the same gang keeps them, cycle after cycle.
    state = _fragmented(gang_reservation_after_s=50.0)
    newer = replace(state.pending[0], id="g2", priority=9, submitted_at=10.0)
    decision = placed(replace(state, pending=(*state.pending, newer)), {}, [])
    assert "are kept for it" in reason_of(decision, "g") and "are kept for it" not in reason_of(decision, "g2")


def test_a_gang_that_can_never_run_takes_no_hosts_from_the_next_longest_waiting():
    state = _fragmented(gang_reservation_after_s=100.0)
    too_large = replace(state.pending[0], id="g0", gpus=20, nodes=5, submitted_at=-10.0)  # 5 hosts; the queue has 4
    decision = check(replace(state, pending=(too_large, *state.pending)), 100.0, [], [])
    assert [r.id for r in decision.reject] == ["g0"] and "are kept for it" in reason_of(decision, "g")


def test_a_gang_that_can_preempt_for_hosts_preempts_rather_than_keep_hosts_draining():
    state = _fragmented(gang_reservation_after_s=100.0)
    # a may reclaim what b borrows: it preempts for hosts, and needs none kept.
    a = replace(state.quotas[0], preemption=replace(state.quotas[0].preemption, reclaim="any"))
    state = replace(state, quotas=(a, *state.quotas[1:]))
    decision = decide(state, 100.0)
    assert decision.preempt and "kept for it" not in reason_of(decision, "g")


def test_gang_reservation_after_s_comes_from_the_quota_file_and_the_decision_file_and_is_bounded():
    from airflow_quota_provider.policy.config import parse_quota_file, queue_to_dict

    data = {"queues": [{"name": "q", "capacity": 8, "gang_reservation_after_s": 3600, "quotas": [{"name": "a", "capacity": 8}]}]}
    (q,) = parse_quota_file(data).queues
    assert q.gang_reservation_after_s == 3600.0 and queue_to_dict(q)["gang_reservation_after_s"] == 3600.0
    assert State.for_queue(q, (), ()).gang_reservation_after_s == 3600.0  # what the executor and simulator decide on
    state, now = parse_state({**_file(), "gang_reservation_after_s": 60})
    assert state.gang_reservation_after_s == 60.0
    # Left out: a day; null: never, which a quota file written back out keeps.
    assert parse_state(_file())[0].gang_reservation_after_s == 86_400.0
    assert parse_state({**_file(), "gang_reservation_after_s": None})[0].gang_reservation_after_s is None
    (default,) = parse_quota_file({"queues": [{**data["queues"][0], "gang_reservation_after_s": None}]}).queues
    assert default.gang_reservation_after_s is None
    assert parse_quota_file({"queues": [queue_to_dict(default)]}).queues[0].gang_reservation_after_s is None
    del data["queues"][0]["gang_reservation_after_s"]
    assert parse_quota_file(data).queues[0].gang_reservation_after_s == 86_400.0
    for bad, message in ((-1, "-1 is below the minimum 0"), (1e9, "above the maximum 2.592e+06"), ("1h", "expected a finite number")):
        with pytest.raises(PolicyError) as raised:
            parse_state({**_file(), "gang_reservation_after_s": bad})
        assert raised.value.path == "gang_reservation_after_s" and message in raised.value.message, str(raised.value)
