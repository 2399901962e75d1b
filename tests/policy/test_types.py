"""GPU types (issue 33): a job queue whose capacity is per type decides each type apart, a job tries
the types in its (or the queue's) order, and the queue's fungibility says when it moves on rather
than borrow or preempt (Kueue's flavorFungibility). Tests are named after the rule they check."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_quota_provider.policy import Host, Job, PolicyError, decide
from airflow_quota_provider.policy.config import parse_quota_file
from airflow_quota_provider.policy.state import State, parse_state
from airflow_quota_provider.policy.types import assign_types

NOW = 1000.0


def queue(fungibility: dict | None = None, **quota_b):
    """h100: 8 (team-a 4, team-b 4); a100: 8 (team-a 4, team-b 4)."""
    data = {"name": "q", "capacity": {"h100": 8, "a100": 8}, "quotas": [
        {"name": "team-a", "capacity": {"h100": 4, "a100": 4}},
        {"name": "team-b", "capacity": {"h100": 4, "a100": 4}, **quota_b},
    ]}
    if fungibility:
        data["fungibility"] = fungibility
    return parse_quota_file({"queues": [data]}).queues[0]


def job(job_id: str, gpus: int, quota: str = "team-a", *, types: tuple[str, ...] = (), running_on: str | None = None,
        priority: int = 1, **kw) -> Job:
    """A waiting job, or a running one of type ``running_on`` (or of none, with ``started_at``)."""
    kw.setdefault("started_at", 0.0 if running_on else None)
    return Job(id=job_id, quota=quota, gpus=gpus, priority=priority, submitted_at=float(len(job_id)) + int(job_id[-1:] or 0),
               gpu_types=types, gpu_type=running_on, **kw)


def admitted(q, running, pending, hosts=None) -> dict[str, str]:
    decision = decide(State.for_queue(q, running, pending, hosts), NOW)
    return {i: decision.types[i] for i in decision.admit}


def test_a_job_takes_the_first_type_of_the_queue_with_room():
    q = queue()
    assert admitted(q, [], [job("p1", 2)]) == {"p1": "h100"}
    h100_full = [job("r1", 4, running_on="h100"), job("r2", 4, "team-b", running_on="h100")]
    assert admitted(q, h100_full, [job("p1", 2)]) == {"p1": "a100"}


def test_a_job_asking_for_types_tries_them_in_its_own_order():
    assert admitted(queue(), [], [job("p1", 2, types=("a100", "h100"))]) == {"p1": "a100"}


def test_by_default_a_job_borrows_on_its_first_type_before_trying_the_next():
    q = queue()  # when_can_borrow: borrow
    assert admitted(q, [job("r1", 4, running_on="h100")], [job("p1", 2, types=("h100", "a100"))]) == {"p1": "h100"}


def test_with_when_can_borrow_try_next_type_a_job_fits_on_a_later_type_before_borrowing():
    q = queue({"when_can_borrow": "try_next_type"})
    assert admitted(q, [job("r1", 4, running_on="h100")], [job("p1", 2, types=("h100", "a100"))]) == {"p1": "a100"}
    # Nowhere within its quota: it borrows on the first type where it can.
    full = [job("r1", 4, running_on="h100"), job("r2", 4, running_on="a100")]
    assert admitted(q, full, [job("p1", 2, types=("h100", "a100"))]) == {"p1": "h100"}


def test_by_default_a_job_borrows_on_a_later_type_rather_than_preempt_on_the_first():
    q = queue(sharing="reserve")  # team-b never lends: team-a's h100 job cannot borrow there
    running = [job("r1", 4, running_on="h100", priority=0)]
    decision = decide(State.for_queue(q, running, [job("p1", 2, priority=9, types=("h100", "a100"))]), NOW)
    assert {i: decision.types[i] for i in decision.admit} == {"p1": "a100"} and decision.preempt == []


def test_with_when_can_preempt_preempt_a_job_preempts_on_its_first_type():
    q = queue({"when_can_preempt": "preempt"}, sharing="reserve")
    running = [job("r1", 4, running_on="h100", priority=0)]
    decision = decide(State.for_queue(q, running, [job("p1", 2, priority=9, types=("h100", "a100"))]), NOW)
    assert [p.id for p in decision.preempt] == ["r1"] and decision.admit == []
    assert decision.pending[0].reason.startswith("h100: ")


def test_where_preempting_is_accepted_a_type_filled_since_becomes_the_choice_of_a_job_alike():
    """when_can_borrow try_next_type, when_can_preempt preempt: p1 could only borrow on h100, so it
    preempts on a100; p2 (team-b) then fills h100, where p3, asking what p1 asked, must preempt too:
    being its first type, h100 is p3's choice, though p1's was a100."""
    q = queue({"when_can_borrow": "try_next_type", "when_can_preempt": "preempt"})
    running = [job("r1", 4, running_on="h100"), job("r2", 4, running_on="a100"), job("r3", 4, "team-b", running_on="a100")]
    pending = [job("p1", 2, priority=9, types=("h100", "a100")), job("p2", 4, "team-b", priority=5, types=("h100",)),
               job("p3", 2, priority=1, types=("h100", "a100"))]
    assigned, _ = assign_types(State.for_queue(q, running, pending), NOW)
    assert {name: [j.id for j in jobs.in_queue_order()] for name, jobs in assigned.items()} == {
        "h100": ["p2", "p3"], "a100": ["p1"]}


def test_an_untyped_job_is_never_a_way_around_a_typed_limit():
    """team-a may hold 4 of each type and borrow none; 6 GPUs fit no type, though 8 are free in all."""
    q = parse_quota_file({"queues": [{"name": "q", "capacity": {"h100": 4, "a100": 4}, "quotas": [
        {"name": "team-a", "capacity": {"h100": 4, "a100": 4}, "sharing": "reserve"}]}]}).queues[0]
    decision = decide(State.for_queue(q, [], [job("p1", 6)]), NOW)
    assert decision.admit == [] and [r.id for r in decision.reject] == ["p1"]
    assert decision.reject[0].reason.startswith("h100: asks for 6 GPUs; quota team-a can never hold more than 4")


def test_a_job_asking_only_for_types_the_queue_lacks_is_rejected_naming_them():
    decision = decide(State.for_queue(queue(), [], [job("p1", 1, types=("l4",))]), NOW)
    assert [(r.id, r.reason) for r in decision.reject] == [
        ("p1", "gpu_type: l4 is not one of this job queue's GPU types (h100, a100)")
    ]


def test_a_job_asking_for_a_type_on_a_queue_without_types_is_rejected_not_run_anywhere():
    untyped = parse_quota_file({"queues": [{"name": "q", "capacity": 8, "quotas": [{"name": "team-a", "capacity": 8}]}]}).queues[0]
    decision = decide(State.for_queue(untyped, [], [job("j1", 1, types=("h100",)), job("j2", 1)]), NOW)
    assert decision.admit == ["j2"]
    assert [(r.id, r.reason.split(";")[0]) for r in decision.reject] == [
        ("j1", "gpu_type: h100 asked, but this job queue has no GPU types (its capacity is one number)")]


def test_a_waiting_jobs_reason_names_the_type_it_waits_on():
    running = [job(f"r{i}", 4, quota, running_on=t) for i, (quota, t) in
               enumerate([("team-a", "h100"), ("team-b", "h100"), ("team-a", "a100"), ("team-b", "a100")])]
    decision = decide(State.for_queue(queue(), running, [job("p1", 2, types=("a100",))]), NOW)
    assert decision.admit == [] and decision.pending[0].reason.startswith("a100: ")


def test_a_running_job_of_none_of_the_queues_types_counts_on_its_hosts_type():
    """r1 was admitted before the queue had types (no gpu_type) and holds all of h-1: h100 is full,
    so p1 takes a100 rather than start on h-1 over r1."""
    hosts = [Host("h-1", 8, type="h100"), Host("a-1", 8, type="a100")]
    decision = decide(State.for_queue(queue(), [job("r1", 8, host="h-1", started_at=0.0)], [job("p1", 4, "team-b")], hosts), NOW)
    assert {i: (decision.types[i], decision.hosts[i]) for i in decision.admit} == {"p1": ("a100", "a-1")}


def test_a_running_job_with_no_host_of_the_queues_types_counts_on_its_first_type_and_waiting_reasons_say_so():
    running = [job("r1", 4, started_at=0.0), job("r2", 4, "team-b", running_on="v100")]  # v100: a type the file dropped
    decision = decide(State.for_queue(queue(), running, [job("p1", 2, types=("h100",)), job("p2", 2, "team-b")]), NOW)
    assert {i: decision.types[i] for i in decision.admit} == {"p2": "a100"}, "h100 is full: 8 of 8 counted there"
    (p1,) = decision.pending
    assert p1.reason.startswith("h100: ") and p1.reason.endswith(
        "; counted on h100: running jobs of none of this job queue's GPU types: r1 (GPU type none), r2 (GPU type v100)"
    ), p1.reason


def test_a_host_of_none_of_the_queues_types_holds_no_job_and_waiting_reasons_name_it():
    hosts = [Host("h-1", 2, type="h100"), Host("x-1", 8), Host("a-1", 2, type="a100")]
    running = [job("r1", 2, "team-b", running_on="h100", host="h-1")]
    pending = [job("p1", 2, types=("h100",)), job("p2", 2), job("p3", 2)]
    decision = decide(State.for_queue(queue(), running, pending, hosts), NOW)
    assert {i: (decision.types[i], decision.hosts[i]) for i in decision.admit} == {"p2": ("a100", "a-1")}
    assert {p.id for p in decision.pending} == {"p1", "p3"} and decision.preempt == []
    for p in decision.pending:
        assert p.reason.endswith(
            "; counted for no GPU type: hosts of none of this job queue's GPU types (h100, a100): x-1 (GPU type none)"
        ), p.reason


def test_a_job_held_for_its_victims_keeps_their_type():
    """p1 preempted r1 on h100 (r1 stops for it); a100 has room now, but p1 waits on h100."""
    q = queue({"when_can_preempt": "preempt"}, sharing="reserve")
    running = [job("r1", 4, running_on="h100", priority=0, preempted_for="p1")]
    decision = decide(State.for_queue(q, running, [job("p1", 4, priority=9)]), NOW)
    assert decision.admit == [] and decision.pending[0].reason.startswith("h100: ")


def test_hosts_of_a_type_hold_only_that_types_jobs():
    hosts = [Host("h-1", 8, type="h100"), Host("a-1", 8, type="a100")]
    q = queue()
    decision = decide(State.for_queue(q, [], [job("p1", 4, types=("a100",)), job("p2", 4)], hosts), NOW)
    assert {i: (decision.types[i], decision.hosts[i]) for i in decision.admit} == {
        "p1": ("a100", "a-1"), "p2": ("h100", "h-1")
    }


def test_a_job_no_host_of_a_type_can_hold_goes_to_a_type_whose_hosts_can():
    hosts = [Host("h-1", 2, type="h100"), Host("h-2", 2, type="h100"), Host("a-1", 8, type="a100")]
    decision = decide(State.for_queue(queue(), [], [job("p1", 4)], hosts), NOW)
    assert {i: decision.types[i] for i in decision.admit} == {"p1": "a100"}


@pytest.mark.parametrize(
    ("change", "error"),
    [
        pytest.param({"capacity": {"h100": 8, "a100": 8, "l4": 1, "t4": 1, "v100": 1, "k80": 1}}, "6 GPU types; at most 5",
                     id="more than five types"),
        pytest.param({"quotas": [{"name": "team-a", "capacity": {"l4": 2}}]},
                     "queues[0].quotas[0].capacity.l4: 'l4' is not one of the job queue's GPU types h100, a100",
                     id="a quota naming a type the queue lacks"),
        pytest.param({"quotas": [{"name": "team-a", "capacity": 4}]}, "a quota's capacity of a job queue with GPU types",
                     id="an integer capacity on a typed queue"),
        pytest.param({"quotas": [{"name": "team-a", "capacity": {"h100": 4}, "borrow_limit": 2}]},
                     "percentage such as \"50%\"", id="an integer borrow limit on a typed queue"),
        pytest.param({"quotas": [{"name": "team-a", "capacity": {"h100": 9}}]},
                     "quota capacities sum to 9, above the job queue's capacity 8 (GPU type h100)", id="a type over its capacity"),
        pytest.param({"fungibility": {"when_can_borrow": "sometimes"}}, "when_can_borrow", id="an unknown fungibility"),
    ],
)
def test_a_typed_quota_file_error_names_the_field_the_type_and_what_is_allowed(change, error):
    data = {"name": "q", "capacity": {"h100": 8, "a100": 8},
            "quotas": [{"name": "team-a", "capacity": {"h100": 4, "a100": 4}}], **change}
    with pytest.raises(PolicyError, match=None) as e:
        parse_quota_file({"queues": [data]})
    assert error in str(e.value)


def test_fungibility_is_refused_on_an_untyped_queue():
    with pytest.raises(PolicyError, match="only for a job queue whose capacity is per GPU type"):
        parse_quota_file({"queues": [{"name": "q", "capacity": 4, "fungibility": {}, "quotas": [{"name": "a", "capacity": 4}]}]})


def test_a_percentage_limit_is_of_each_types_capacity_of_the_quota():
    q = queue(borrow_limit="50%", lend_limit={"h100": 1})
    b = {t.name: t.quota("team-b") for t in q.types}
    assert {n: (x.borrow_limit, x.lend_limit) for n, x in b.items()} == {"h100": (2, 1), "a100": (2, None)}


def test_a_typed_decision_file_round_trips_types_hosts_and_the_chosen_type():
    data = {
        "now": NOW, "capacity": {"h100": 4, "a100": 4},
        "quotas": [{"name": "team-a", "capacity": {"h100": 4, "a100": 4}}],
        "hosts": [{"name": "h-1", "gpus": 4, "type": "h100"}, {"name": "a-1", "gpus": 4, "type": "a100"}],
        "running": [{"id": "r1", "quota": "team-a", "gpus": 4, "priority": 1, "submitted_at": 0, "started_at": 0,
                     "host": "h-1", "gpu_type": "h100"}],
        "pending": [{"id": "p1", "quota": "team-a", "gpus": 2, "priority": 1, "submitted_at": 1, "gpu_type": ["h100", "a100"]}],
    }
    state, now = parse_state(data)
    assert decide(state, now).to_dict()["admit"] == [{"id": "p1", "host": "a-1", "gpu_type": "a100"}]
    wrong = {**data, "running": [{**data["running"][0], "gpu_type": "a100"}]}
    with pytest.raises(PolicyError, match=r"running\[0\]\.gpu_type: a100 on host h-1, whose GPUs are h100"):
        parse_state(wrong)


# ----------------------------------------------------------------------------------- properties

TYPES = ("h100", "a100", "l4")


@st.composite
def typed_states(draw):
    types = TYPES[: draw(st.integers(1, 3))]
    capacities = {t: draw(st.integers(2, 12)) for t in types}
    quotas = []
    for name in ("team-a", "team-b", "team-c"):
        shares = {t: draw(st.integers(0, capacities[t] // 3)) for t in types}
        quota = {"name": name, "capacity": shares, "sharing": draw(st.sampled_from(["lend_and_borrow", "reserve"]))}
        if quota["sharing"] == "lend_and_borrow" and draw(st.booleans()):
            quota["borrow_limit"] = draw(st.sampled_from(["0%", "50%", "100%"]))
        quotas.append(quota)
    fungibility = {"when_can_borrow": draw(st.sampled_from(["borrow", "try_next_type"])),
                   "when_can_preempt": draw(st.sampled_from(["preempt", "try_next_type"]))}
    q = parse_quota_file({"queues": [{"name": "q", "capacity": capacities, "quotas": quotas, "fungibility": fungibility}]}).queues[0]
    pending = [
        Job(id=f"p{i}", quota=draw(st.sampled_from([x["name"] for x in quotas])), gpus=draw(st.integers(1, 6)),
            priority=draw(st.integers(0, 3)), submitted_at=float(i),
            gpu_types=tuple(draw(st.lists(st.sampled_from(types), max_size=2, unique=True))))
        for i in range(draw(st.integers(1, 14)))
    ]
    # Jobs admitted before the file had types (or of a type it dropped), each within its quota's
    # share of the first type; with hosts, on a host of no type of the queue, x-1.
    legacy = [
        Job(id=f"r{i}", quota=quota["name"], gpus=quota["capacity"][types[0]], priority=draw(st.integers(0, 3)),
            submitted_at=-1.0, started_at=0.0, gpu_type=draw(st.sampled_from([None, "v100"])))
        for i, quota in enumerate(quotas) if quota["capacity"][types[0]] and draw(st.booleans())
    ]
    hosts = None
    if draw(st.booleans()):
        hosts = [Host("x-1", max(1, sum(j.gpus for j in legacy)))]
        for t in types:
            first = draw(st.integers(1, capacities[t]))
            hosts += [Host(f"{t}-{i}", n, type=t) for i, n in enumerate((first, capacities[t] - first)) if n]
        legacy = [replace(j, host="x-1") for j in legacy]
    return q, legacy, pending, hosts


def _used(q, running) -> tuple[dict, dict]:
    """GPUs per type and per (type, quota), a job of none of the queue's types counted on its first."""
    per_type, per_quota = {t.name: 0 for t in q.types}, {}
    for j in running:
        gpu_type = j.gpu_type if j.gpu_type in per_type else q.types[0].name
        per_type[gpu_type] += j.gpus
        per_quota[gpu_type, j.quota] = per_quota.get((gpu_type, j.quota), 0) + j.gpus
    return per_type, per_quota


@settings(max_examples=300, deadline=None)
@given(typed_states(), st.randoms(use_true_random=False))
def test_no_type_and_no_quota_of_a_type_ever_holds_more_than_it_may_and_jobs_run_on_types_they_asked_for(drawn, rnd):
    """Untyped jobs, and running jobs of no type of the queue, included: neither is a way around a
    type's limits, and nothing starts on a host of no type of the queue, nor beyond a host's GPUs."""
    q, running, pending, hosts = drawn
    for cycle in range(3):  # admissions become running jobs; a victim stops before its preemptor runs
        decision = decide(State.for_queue(q, running, pending, hosts), NOW + cycle)
        again = decide(State.for_queue(q, running, pending, hosts), NOW + cycle)
        assert decision.to_dict() == again.to_dict(), "deterministic"
        victims = {p.id for p in decision.preempt}
        running = [j for j in running if j.id not in victims]
        by_id = {j.id: j for j in pending}
        for job_id in decision.admit:
            j = by_id[job_id]
            assert not j.gpu_types or decision.types[job_id] in j.gpu_types, "only on a type it asked for"
            host = decision.hosts.get(job_id)
            assert hosts is None or next(h.type for h in hosts if h.name == host) == decision.types[job_id], host
            running.append(replace(j, gpu_type=decision.types[job_id], started_at=NOW + cycle, host=host))
        admitted = set(decision.admit) | {r.id for r in decision.reject}
        pending = [j for j in pending if j.id not in admitted]
        for h in hosts or ():
            assert sum(j.gpus for j in running if j.host == h.name) <= h.gpus, h
        per_type, per_quota = _used(q, running)
        for t in q.types:
            assert per_type[t.name] <= t.capacity, (t.name, per_type)
            for quota in t.quotas:
                limit = quota.capacity + (0 if not quota.borrows else
                                          (t.capacity if quota.borrow_limit is None else quota.borrow_limit))
                assert per_quota.get((t.name, quota.name), 0) <= limit, (t.name, quota.name, per_quota)
        rnd.shuffle(pending)


def test_instance_types_name_each_type_of_a_typed_queue_and_only_there():
    data = {"name": "q", "capacity": {"h100": 8}, "quotas": [{"name": "a", "capacity": {"h100": 8}, "borrow_limit": "50%"}],
            "instance_types": {"h100": "ml.p5.48xlarge"}}
    q = parse_quota_file({"queues": [data]}).queues[0]
    assert (q.instance_types, q.quotas[0].borrow_limit_percent) == ({"h100": "ml.p5.48xlarge"}, 50.0)
    with pytest.raises(PolicyError, match=r"queues\[0\]\.instance_types\.l4: 'l4' is not one of the job queue's GPU types h100"):
        parse_quota_file({"queues": [{**data, "instance_types": {"l4": "ml.g6.48xlarge"}}]})
    with pytest.raises(PolicyError, match="only for a job queue whose capacity is per GPU type"):
        parse_quota_file({"queues": [{"name": "q", "capacity": 8, "quotas": [{"name": "a", "capacity": 8}],
                                      "instance_types": {"h100": "ml.p5.48xlarge"}}]})


def test_a_job_goes_to_a_type_whose_hosts_are_up_rather_than_wait_for_one_whose_hosts_are_down():
    hosts = [Host("h-1", 8, type="h100", down=True), Host("a-1", 8, type="a100")]
    decision = decide(State.for_queue(queue(), [], [job("p1", 4)], hosts), NOW)
    assert {i: decision.types[i] for i in decision.admit} == {"p1": "a100"}
