"""Invariants of ``decide`` with gangs (multi-host jobs) over generated queues (hypothesis): no
partial admission, no host over its GPUs, gang victims whole, the quota arithmetic on every node's
GPUs, rejections exactly where the fleet cannot hold a gang, and determinism.

The states are those of :func:`tests.policy.test_properties.host_states` with gangs added: running
gangs with one node on each of 2-3 different hosts, waiting gangs of 2-4 nodes, hosts in racks, and
hosts kept for a gang that has waited (``gang_reservation_after_s``) or not, with expected runtimes
(backfill) or not.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from airflow_quota_provider.policy import Host, Job, PreemptionPolicy, Quota, State, decide
from tests.policy.test_properties import NOW, balanced, host_states, logical_end, shuffled

_HELD_ON = re.compile(r"GPUs on (\S+?)[: ]")
_GANG_HELD_ON = re.compile(r"GPUs on each of (.+?) are held for it")
_KEPT = re.compile(r": (.+?) are kept for it.*?(?:expected in (\d+) s|$)")


@st.composite
def gang_states(draw) -> State:
    """:func:`host_states` plus gangs, on 2-5 hosts that may carry rack labels."""
    state = draw(host_states(tree=draw(st.booleans())))
    hosts = list(state.hosts)
    for index in range(draw(st.integers(0, 3))):
        hosts.append(Host(f"g{index}", draw(st.integers(1, 8))))
    if draw(st.booleans()):
        hosts = [replace(host, rack=f"r{draw(st.integers(0, 1))}") for host in hosts]
    free = {h.name: h.gpus for h in hosts}
    for job in state.running:
        free[job.host] -= job.gpus
    used = {q.name: 0 for q in state.quotas}
    for job in state.running:
        if job.preempted_for is None:
            used[job.quota] += job.gpus
    by_name = {q.name: q for q in state.quotas}
    capacity = max(state.capacity, sum(h.gpus for h in hosts))
    running = list(state.running)
    for index in range(draw(st.integers(0, 3)) if len(free) > 1 else 0):
        per = draw(st.integers(1, 4))
        names = draw(st.lists(st.sampled_from(sorted(free)), min_size=2, max_size=3, unique=True))
        quota = draw(st.sampled_from(sorted(by_name)))
        stopping = f"p{draw(st.integers(0, 7))}" if draw(st.integers(0, 5)) == 0 else None
        trial = dict(used, **{quota: used[quota] + per * len(names)})
        if any(free[name] < per for name in names) or (stopping is None and not balanced(trial, by_name, capacity, cohorts=state.cohorts)):
            continue
        for name in names:
            free[name] -= per
        if stopping is None:
            used = trial
        running.append(Job(
            id=f"rg{index}", quota=quota, gpus=per * len(names), priority=draw(st.integers(0, 5)),
            submitted_at=0.0, started_at=float(draw(st.integers(0, 100))), preemptible=draw(st.booleans()),
            preempted_for=stopping, host=names[0], hosts=tuple(names), nodes=len(names),
        ))
    pending = list(state.pending)
    for index in range(draw(st.integers(1, 3))):
        nodes, per = draw(st.integers(2, 4)), draw(st.integers(1, 8))
        pending.append(Job(
            id=f"pg{index}", quota=draw(st.sampled_from(sorted(by_name))), gpus=per * nodes, nodes=nodes,
            priority=draw(st.integers(0, 5)), submitted_at=float(draw(st.integers(0, 100))),
        ))
    if draw(st.booleans()):  # runtimes known for some jobs: kept hosts may be backfilled
        ends_after_now = st.one_of(st.none(), st.integers(0, 400).map(float))  # started at 0-100, now 100
        running = [replace(job, expected_runtime_s=draw(ends_after_now)) for job in running]
        pending = [replace(job, expected_runtime_s=draw(st.one_of(st.none(), st.integers(0, 300).map(float)))) for job in pending]
    return replace(state, capacity=capacity, hosts=tuple(hosts), running=tuple(running), pending=tuple(pending),
                   gang_reservation_after_s=draw(st.sampled_from([None, 0.0, 50.0])))


def _each_node(job: Job, where) -> list[tuple[str, int]]:
    return [(where, job.gpus)] if isinstance(where, str) else [(name, job.gpus_per_node) for name in where]


@given(gang_states())
def test_no_gang_starts_in_part_and_no_host_ever_holds_more_gpus_than_it_has(state):
    decision = decide(state, NOW)
    gpus = {h.name: h.gpus for h in state.hosts}
    jobs = {job.id: job for job in state.pending}
    now = dict.fromkeys(gpus, 0)
    settled = dict.fromkeys(gpus, 0)
    stopping = {p.id for p in decision.preempt} | {j.id for j in state.running if j.preempted_for is not None}
    # Spared jobs a held one awaits (expected to end within their grace period) leave their GPUs to it.
    stopping |= {job_id for pending in decision.pending for job_id in pending.awaits}
    for job in state.running:
        for name in job.placed_on:
            now[name] += job.gpus_per_node
            if job.id not in stopping:
                settled[name] += job.gpus_per_node
    for job_id in decision.admit:
        job, where = jobs[job_id], decision.hosts[job_id]
        if job.nodes > 1:
            assert isinstance(where, list) and len(set(where)) == job.nodes, (job_id, where)
        for name, held in _each_node(job, where):
            now[name] += held
            settled[name] += held
    for pending in decision.pending:
        if pending.reason.startswith("waiting for"):
            job = jobs[pending.id]
            held_on = (_GANG_HELD_ON if job.nodes > 1 else _HELD_ON).search(pending.reason)
            assert held_on, pending.reason
            where = held_on.group(1) if job.nodes == 1 else held_on.group(1).split(", ")
            assert job.nodes == 1 or len(set(where)) == job.nodes, pending.reason
            for name, held in _each_node(job, where):
                settled[name] += held
    assert all(now[name] <= gpus[name] for name in gpus), (now, decision)
    assert all(settled[name] <= gpus[name] for name in gpus), (settled, decision)


@given(gang_states())
def test_gangs_count_every_nodes_gpus_and_a_gang_victim_is_preempted_once(state):
    decision = decide(state, NOW)
    assert balanced(logical_end(state, decision), {q.name: q for q in state.quotas}, state.capacity, cohorts=state.cohorts)
    victims = [p.id for p in decision.preempt]
    assert len(victims) == len(set(victims))


@given(gang_states())
def test_a_gang_is_rejected_exactly_when_too_few_hosts_could_ever_hold_a_node(state):
    decision = decide(state, NOW)
    rejected = {r.id for r in decision.reject}
    for job in state.pending:
        if job.nodes > 1:
            enough = sum(1 for h in state.hosts if h.gpus >= job.gpus_per_node)
            if enough < job.nodes:
                assert job.id in rejected
            elif job.id in rejected:
                assert "can never hold" in next(r.reason for r in decision.reject if r.id == job.id)


@given(gang_states(), st.randoms())
def test_with_gangs_the_same_input_always_gives_the_same_decision(state, rng: random.Random):
    decision = decide(state, NOW).to_dict()
    assert decide(shuffled(state, rng), NOW).to_dict() == decision


@given(gang_states())
def test_a_job_starts_on_hosts_kept_for_a_gang_only_if_expected_to_end_before_they_have_room(state):
    """Jobs started there (the first ``backfill_states`` below draws the case) are backfilled: Slurm's rule."""
    decision = decide(state, NOW)
    kept = [_KEPT.search(p.reason) for p in decision.pending if "are kept for it" in p.reason]
    assert len(kept) <= 1, decision.pending  # one gang a cycle
    if not kept:
        return
    hosts, until = set(kept[0].group(1).split(", ")), kept[0].group(2)
    # Jobs placed before the gang's turn may be on those hosts: they are there without waiting runtimes too.
    unknown = decide(replace(state, pending=tuple(replace(j, expected_runtime_s=None) for j in state.pending)), NOW)
    jobs = {job.id: job for job in state.pending}
    for job_id in decision.admit:
        where = decision.hosts[job_id]
        if isinstance(where, str) and where in hosts and unknown.hosts.get(job_id) != where:
            runtime = jobs[job_id].expected_runtime_s
            assert until is not None and runtime is not None and runtime <= int(until) + 1, (job_id, kept[0].group(0))


@st.composite
def backfill_states(draw) -> State:
    """A gang (quota a, 2 nodes of 4) that has waited, on four hosts of 4 that quota b's jobs fragment
    (a reclaims nothing, so it keeps hosts), and jobs of quota c that might start on the kept hosts;
    runtimes known or not, the queue's capacity (24) above the hosts' (16)."""
    running = []
    for host in ("h1", "h2", "h3", "h4"):
        free = 4
        for index in range(draw(st.integers(1, 3))):
            gpus = draw(st.integers(1, free - (2 - index if index < 2 else 0))) if free > 1 else 0
            if not gpus:
                break
            free -= gpus
            running.append(Job(id=f"r{host}{index}", quota="b", gpus=gpus, priority=0, submitted_at=0.0,
                               started_at=float(draw(st.integers(0, 100))),
                               expected_runtime_s=draw(st.one_of(st.none(), st.integers(0, 900).map(float)))))
    pending = [Job(id="g", quota="a", gpus=8, nodes=2, priority=5, submitted_at=0.0)]
    for index in range(draw(st.integers(1, 4))):
        pending.append(Job(id=f"c{index}", quota="c", gpus=draw(st.integers(1, 3)), priority=draw(st.integers(0, 9)),
                           submitted_at=float(draw(st.integers(0, 100))),
                           expected_runtime_s=draw(st.one_of(st.none(), st.integers(0, 300).map(float)))))
    quotas = (
        Quota("a", 8, preemption=PreemptionPolicy(reclaim="never")), Quota("b", 8),
        Quota("c", 4, preemption=PreemptionPolicy(reclaim="never", within_quota="never")),
    )
    hosts = tuple(Host(f"h{i}", 4) for i in range(1, 5))
    placed = [replace(job, host=f"h{job.id[2]}") for job in running]
    return State(capacity=24, quotas=quotas, running=tuple(placed), pending=tuple(pending), hosts=hosts,
                 gang_reservation_after_s=0.0)


@given(backfill_states())
def test_jobs_started_on_hosts_kept_for_a_gang_end_before_it_has_room_there(state):
    test_a_job_starts_on_hosts_kept_for_a_gang_only_if_expected_to_end_before_they_have_room.hypothesis.inner_test(state)
