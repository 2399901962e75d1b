"""Gangs (multi-host jobs, issue 32): one table of cases per rule, each case named after its rule.

A gang of ``nodes`` nodes asks for ``gpus`` GPUs on each of as many different hosts, counts all of
them against its quota, is admitted all or nothing and preempted as one victim. ``placed`` checks
the admissions with their hosts (a gang's as a list, node 0's first) and the preemptions.
"""

from __future__ import annotations

import pytest

from airflow_quota_provider.policy import decide, parse_state
from airflow_quota_provider.policy.errors import PolicyError
from tests.policy.builders import queue
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
