"""Invariants of ``decide`` over generated queues, with and without hosts, flat and with cohorts
(hypothesis; 1,000 examples each in CI).

The balance rule is re-derived here from DESIGN §2 (with cohorts: from Kueue's hierarchical cohorts),
independently of ``policy.capacity``, and every generated running set is built by admitting jobs one
by one while that rule holds.
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from hypothesis import assume, given
from hypothesis import strategies as st

from airflow_quota_provider.policy import Cohort, Host, Job, PreemptionPolicy, Quota, State, decide
from airflow_quota_provider.policy.capacity import Usage
from airflow_quota_provider.policy.ordering import queue_order

SHARING = ("reserve", "lend", "lend_and_borrow")


def balanced(
    used: dict[str, int], quotas: dict[str, Quota], capacity: int, *, within: str | None = None, cohorts: tuple[Cohort, ...] = ()
) -> bool:
    """DESIGN §2: every quota within its capacity or borrow limit, borrowing covered by what is lent;
    with ``within``, that quota must also stay within its own capacity. With ``cohorts``, every
    cohort within its share plus its borrow limit and the root within its share (:func:`tree_figures`)."""
    if cohorts:
        return _quotas_within_limits(used, quotas, within) and sum(used.values()) <= capacity and all(
            figure.used <= figure.share + (figure.borrow_limit if figure.borrow_limit is not None else float("inf"))
            for figure in tree_figures(used, quotas, capacity, cohorts).values()
        )
    common = capacity - sum(q.capacity for q in quotas.values())
    borrowed_total = lent = 0
    for name, quota in quotas.items():
        use = used.get(name, 0)
        if use > quota.capacity:
            if quota.sharing != "lend_and_borrow" or name == within:
                return False
            if quota.borrow_limit is not None and use - quota.capacity > quota.borrow_limit:
                return False
            borrowed_total += use - quota.capacity
        elif quota.sharing != "reserve":
            private = quota.capacity - (quota.lend_limit if quota.lend_limit is not None else quota.capacity)
            lent += max(0, quota.capacity - max(use, private))
    return borrowed_total <= common + lent and sum(used.values()) <= capacity


def _quotas_within_limits(used: dict[str, int], quotas: dict[str, Quota], within: str | None) -> bool:
    for name, quota in quotas.items():
        above = used.get(name, 0) - quota.capacity
        if above > 0 and (quota.sharing != "lend_and_borrow" or name == within):
            return False
        if above > 0 and quota.borrow_limit is not None and above > quota.borrow_limit:
            return False
    return True


class Figure:
    """One cohort (or the root, ``""``): its share (what it owns plus what its children lend into it),
    the part it keeps from its parent, and its usage (what its children use beyond the parts they keep)."""

    def __init__(self, share: int, kept: int, used: int, borrow_limit: int | None) -> None:
        self.share, self.kept, self.used, self.borrow_limit = share, kept, used, borrow_limit


def _private(quota: Quota) -> int:
    if quota.sharing == "reserve":
        return quota.capacity
    return quota.capacity - (quota.lend_limit if quota.lend_limit is not None else quota.capacity)


def tree_figures(used: dict[str, int], quotas: dict[str, Quota], capacity: int, cohorts: tuple[Cohort, ...]) -> dict[str, Figure]:
    """Kueue's subtree quotas and usages, computed by walking the tree from the root."""
    figures: dict[str, Figure] = {}

    def visit(name: str, own: int, lend_limit: int | None, borrow_limit: int | None) -> Figure:
        share, usage = own, 0
        for quota in quotas.values():
            if (quota.cohort or "") == name:
                share += quota.capacity - _private(quota)
                usage += max(0, used.get(quota.name, 0) - _private(quota))
        for cohort in cohorts:
            if (cohort.parent or "") == name:
                child = visit(cohort.name, cohort.capacity, cohort.lend_limit, cohort.borrow_limit)
                share += child.share - child.kept
                usage += max(0, child.used - child.kept)
        kept = 0 if lend_limit is None else max(0, share - lend_limit)
        figures[name] = Figure(share, kept, usage, borrow_limit)
        return figures[name]

    common = capacity - sum(q.capacity for q in quotas.values()) - sum(c.capacity for c in cohorts)
    visit("", common, None, 0)  # the root borrows from nobody
    return figures


def members(quotas: dict[str, Quota], cohorts: tuple[Cohort, ...], name: str) -> set[str]:
    """The quotas in cohort ``name``'s subtree."""
    return {quota.name for quota in quotas.values() if _under(cohorts, quota.cohort, name)}


def _under(cohorts: tuple[Cohort, ...], name: str | None, ancestor: str) -> bool:
    """Cohort ``name`` is ``ancestor`` or below it (None, the root, is below no cohort)."""
    parents = {c.name: c.parent for c in cohorts}
    while name is not None and name != ancestor:
        name = parents[name]
    return name == ancestor


@st.composite
def quotas(draw) -> tuple[Quota, ...]:
    result = []
    for index in range(draw(st.integers(1, 4))):
        capacity = draw(st.integers(0, 6))
        sharing = draw(st.sampled_from(SHARING))
        result.append(
            Quota(
                name=f"q{index}",
                capacity=capacity,
                sharing=sharing,
                borrow_limit=draw(st.none() | st.integers(0, 4)) if sharing == "lend_and_borrow" else None,
                lend_limit=draw(st.none() | st.integers(0, capacity)) if sharing != "reserve" else None,
                weight=draw(st.sampled_from((1.0, 2.0, 3.0))),
                preemption=PreemptionPolicy(
                    within_quota=draw(st.sampled_from(("never", "lower_priority", "lower_or_newer_equal_priority"))),
                    reclaim=draw(st.sampled_from(("never", "lower_priority", "any"))),
                    borrow_within=draw(st.none() | st.integers(0, 5)) if sharing == "lend_and_borrow" else None,
                ),
                min_runtime_s=draw(st.sampled_from((0.0, 0.0, 50.0))),
                preemption_delay_s=draw(st.sampled_from((0.0, 0.0, 50.0))),
                max_preemptions=draw(st.none() | st.integers(0, 2)),
                on_preemption_limit=draw(st.sampled_from(("fail", "protect"))),
            )
        )
    return tuple(result)


@st.composite
def pending_jobs(draw, quota_names: list[str], *, max_gpus: int) -> list[Job]:
    """Up to 8 waiting jobs ``p0, p1, ...`` of the given quotas, 1 to ``max_gpus`` GPUs each."""
    return [
        Job(
            id=f"p{index}",
            quota=draw(st.sampled_from(quota_names)),
            gpus=draw(st.integers(1, max_gpus)),
            priority=draw(st.integers(0, 5)),
            submitted_at=float(draw(st.integers(0, 100))),
        )
        for index in range(draw(st.integers(0, 8)))
    ]


@st.composite
def cohort_trees(draw, quota_list: tuple[Quota, ...]) -> tuple[tuple[Cohort, ...], tuple[Quota, ...]]:
    """1-4 cohorts, each under the root or an earlier one, and the quotas spread over them and the root;
    a cohort's lend limit is dropped where it is above what its subtree can lend (the file refuses it)."""
    cohorts: list[Cohort] = []
    for index in range(draw(st.integers(1, 4))):
        cohorts.append(
            Cohort(
                name=f"c{index}",
                parent=draw(st.sampled_from([None, *(c.name for c in cohorts)])),
                capacity=draw(st.integers(0, 4)),
                borrow_limit=draw(st.none() | st.integers(0, 4)),
                lend_limit=draw(st.none() | st.integers(0, 6)),
            )
        )
    quota_list = tuple(replace(q, cohort=draw(st.sampled_from([None, *(c.name for c in cohorts)]))) for q in quota_list)
    by_name = {q.name: q for q in quota_list}
    capacity = sum(q.capacity for q in quota_list) + sum(c.capacity for c in cohorts)
    for index in reversed(range(len(cohorts))):  # children (later) before parents: a share counts what children lend
        share = tree_figures({}, by_name, capacity, tuple(cohorts))[cohorts[index].name].share
        if cohorts[index].lend_limit is not None and cohorts[index].lend_limit > share:
            cohorts[index] = replace(cohorts[index], lend_limit=None)
    return tuple(cohorts), quota_list


@st.composite
def states(draw, *, protections: bool = True, stopping: bool = True, tree: bool = False) -> State:
    quota_list = draw(quotas())
    cohorts: tuple[Cohort, ...] = ()
    if tree:
        cohorts, quota_list = draw(cohort_trees(quota_list))
    if not protections:
        quota_list = tuple(
            replace(q, min_runtime_s=0.0, preemption_delay_s=0.0, on_preemption_limit="fail", preemption=replace(q.preemption, reclaim="any"))
            for q in quota_list
        )
    by_name = {q.name: q for q in quota_list}
    owned = sum(q.capacity for q in quota_list) + sum(c.capacity for c in cohorts)
    capacity = max(1, owned + draw(st.integers(0, 4)))
    used = dict.fromkeys(by_name, 0)
    physical = 0
    running = []
    # A tree's reclaims need a full queue: more jobs are tried, most of them refused by the balance.
    for index in range(draw(st.integers(0, 20 if tree else 10))):
        name = draw(st.sampled_from(sorted(by_name)))
        gpus = draw(st.integers(1, 4))
        is_stopping = stopping and draw(st.integers(0, 5)) == 0
        trial = dict(used, **{name: used[name] + gpus})
        if physical + gpus > capacity or (not is_stopping and not balanced(trial, by_name, capacity, cohorts=cohorts)):
            continue
        physical += gpus
        if not is_stopping:
            used = trial
        running.append(
            Job(
                id=f"r{index}",
                quota=name,
                gpus=gpus,
                priority=draw(st.integers(0, 5)),
                submitted_at=float(draw(st.integers(0, 50))),
                started_at=float(draw(st.integers(0, 100))),
                preemptible=draw(st.booleans()) if protections else True,
                preemptions=draw(st.integers(0, 3)),
                preempted_for=(f"p{draw(st.integers(0, 7))}" if is_stopping else None),
            )
        )
    owners = sorted(name for name, quota in by_name.items() if used[name] < quota.capacity or quota.cohort is not None)
    # A tree's waiting jobs go mostly to quotas that may reclaim: below their capacity, or in a cohort.
    pending = draw(pending_jobs(owners if tree and owners and draw(st.booleans()) else sorted(by_name), max_gpus=5))
    return State(capacity, quota_list, tuple(running), tuple(pending), cohorts=cohorts)


def logical_start(state: State) -> dict[str, int]:
    used = {q.name: 0 for q in state.quotas}
    for job in state.running:
        if job.preempted_for is None:
            used[job.quota] += job.gpus
    return used


def logical_end(state: State, decision) -> dict[str, int]:
    """Usage once every victim has stopped, every job a held one awaits has ended (spared: expected to
    finish within its grace period, its GPUs are the preemptor's) and every admitted or held job runs."""
    used = logical_start(state)
    jobs = {job.id: job for job in state.pending}
    running = {job.id: job for job in state.running}
    for preemption in decision.preempt:
        used[preemption.quota] -= running[preemption.id].gpus
    for spared in {job_id for pending in decision.pending for job_id in pending.awaits}:
        used[running[spared].quota] -= running[spared].gpus
    holding = {p.id for p in decision.pending if p.reason.startswith("waiting for")}
    for job_id in [*decision.admit, *holding]:
        used[jobs[job_id].quota] += jobs[job_id].gpus
    return used


NOW = 100.0


@given(quotas(), st.integers(0, 4), st.lists(st.tuples(st.integers(0, 3), st.integers(-4, 4)), max_size=16))
def test_usage_changed_gpu_by_gpu_fits_as_the_balance_rule_says(quota_list, spare, changes):
    """A :class:`Usage` kept up to date through ``add``/``remove`` (its shortcut for a quota above its
    capacity before and after included) has the figures of one built afresh from the same usage (its
    own shortcut), and both answer ``fits`` as the balance rule re-derived here."""
    by_name = {q.name: q for q in quota_list}
    names = sorted(by_name)
    capacity = max(1, sum(q.capacity for q in quota_list) + spare)
    usage = Usage(capacity, quota_list)
    used = dict.fromkeys(names, 0)
    for index, delta in changes:
        name = names[index % len(names)]
        trial = dict(used, **{name: max(0, used[name] + delta)})
        if balanced(trial, by_name, capacity):
            (usage.add if trial[name] >= used[name] else usage.remove)(name, abs(trial[name] - used[name]))
            used = trial
    fresh = Usage(capacity, quota_list, used)
    assert usage.used == fresh.used == used
    assert (usage.supply, usage.borrowed_total) == (fresh.supply, fresh.borrowed_total)
    for name in names:
        for gpus in range(1, 6):
            for borrow in (False, True):
                trial = dict(used, **{name: used[name] + gpus})
                expected = balanced(trial, by_name, capacity, within=None if borrow else name)
                assert usage.fits(name, gpus, borrow=borrow) == fresh.fits(name, gpus, borrow=borrow) == expected


@given(states())
def test_capacity_is_never_exceeded_once_victims_have_stopped(state):
    decision = decide(state, NOW)
    quotas_by_name = {q.name: q for q in state.quotas}
    assert balanced(logical_end(state, decision), quotas_by_name, state.capacity)
    jobs = {job.id: job for job in state.pending}
    physical_now = sum(j.gpus for j in state.running) + sum(jobs[i].gpus for i in decision.admit)
    assert physical_now <= state.capacity


@given(states(protections=False, stopping=False))
def test_a_job_fitting_its_own_unused_capacity_starts_or_gets_its_victims_in_the_same_cycle(state):
    """...or holds its capacity while GPUs that this cycle's victims (of another job) free suffice:
    with no job stopping before the cycle, nothing else can hold the GPUs it waits for."""
    decision = decide(state, NOW)
    used = logical_start(state)
    rejected = {r.id for r in decision.reject}
    reasons = {p.id: p.reason for p in decision.pending}
    for quota in state.quotas:
        own = sorted((j for j in state.pending if j.quota == quota.name and j.id not in rejected), key=queue_order)
        if own and own[0].gpus <= quota.capacity - used[quota.name]:
            first = own[0]
            holds = decision.preempt and reasons.get(first.id, "").startswith("waiting for stopping jobs to release")
            assert first.id in decision.admit or any(p.for_ == first.id for p in decision.preempt) or holds, decision


@given(states())
def test_no_chosen_victim_can_be_given_back_while_the_job_still_fits(state):
    decision = decide(state, NOW)
    preemptors = {p.for_ for p in decision.preempt}
    if len(preemptors) != 1:
        return
    (preemptor_id,) = preemptors
    preemptor = next(j for j in state.pending if j.id == preemptor_id)
    pending_by_id = {j.id: j for j in state.pending}
    if any(pending_by_id[j].quota == preemptor.quota for j in decision.admit if j != preemptor_id):
        # Another job of its quota started too, perhaps after the search (borrowing): the usage at
        # the end of the cycle then says nothing about whether the preemptor was to stay within its
        # capacity when its victims were chosen.
        return
    quotas_by_name = {q.name: q for q in state.quotas}
    end = logical_end(state, decision)
    within = preemptor.quota if end[preemptor.quota] <= quotas_by_name[preemptor.quota].capacity else None
    for preemption in decision.preempt:
        victim = next(j for j in state.running if j.id == preemption.id)
        given_back = dict(end, **{victim.quota: end[victim.quota] + victim.gpus})
        assert not balanced(given_back, quotas_by_name, state.capacity, within=within), preemption


@given(states())
def test_a_quota_within_its_capacity_never_loses_a_job_to_another_quota(state):
    decision = decide(state, NOW)
    quotas_by_name = {q.name: q for q in state.quotas}
    pending_by_id = {j.id: j for j in state.pending}
    running_by_id = {j.id: j for j in state.running}
    # The most each quota can have used at any point of the cycle: at the start plus what it took in.
    most = logical_start(state)
    for job_id in [*decision.admit, *(p.id for p in decision.pending if p.reason.startswith("waiting for"))]:
        most[pending_by_id[job_id].quota] += pending_by_id[job_id].gpus
    for preemption in decision.preempt:
        victim = running_by_id[preemption.id]
        preemptor = pending_by_id[preemption.for_]
        if victim.quota != preemptor.quota:
            assert most[victim.quota] > quotas_by_name[victim.quota].capacity, preemption
        most[victim.quota] -= victim.gpus


@given(states(), st.randoms())
def test_the_same_input_always_gives_the_same_decision(state, rng: random.Random):
    decision = decide(state, NOW).to_dict()
    assert decide(state, NOW).to_dict() == decision
    shuffled_running, shuffled_pending = list(state.running), list(state.pending)
    rng.shuffle(shuffled_running)
    rng.shuffle(shuffled_pending)
    shuffled = replace(state, running=tuple(shuffled_running), pending=tuple(shuffled_pending))
    assert decide(shuffled, NOW).to_dict() == decision


# -- hierarchical cohorts (DESIGN §2) ---------------------------------------------------------------


@given(states(tree=True))
def test_no_node_ever_exceeds_its_capacity_plus_its_borrow_limit(state):
    decision = decide(state, NOW)
    quotas_by_name = {q.name: q for q in state.quotas}
    assert balanced(logical_end(state, decision), quotas_by_name, state.capacity, cohorts=state.cohorts)
    jobs = {job.id: job for job in state.pending}
    assert sum(j.gpus for j in state.running) + sum(jobs[i].gpus for i in decision.admit) <= state.capacity


@given(states(tree=True))
def test_no_subtree_lends_beyond_its_lend_limit(state):
    """GPUs used outside a cohort come from what no member of it owns, plus at most its lend limit."""
    decision = decide(state, NOW)
    quotas_by_name = {q.name: q for q in state.quotas}
    end = logical_end(state, decision)
    for cohort in state.cohorts:
        if cohort.lend_limit is None:
            continue
        inside = members(quotas_by_name, state.cohorts, cohort.name)
        owned = sum(quotas_by_name[name].capacity for name in inside) + sum(
            c.capacity for c in state.cohorts if _under(state.cohorts, c.name, cohort.name)
        )
        outside = sum(gpus for name, gpus in end.items() if name not in inside)
        assert outside <= state.capacity - owned + cohort.lend_limit, (cohort, end)


@given(states(tree=True, protections=False))
def test_reclaim_never_preempts_inside_a_subtree_within_its_share(state):
    """A victim of another quota's job: its quota and every cohort between it and the preemptor's
    lowest common cohort ran above its share at some point of the cycle (the most each can have used:
    at the start plus what it took in, less the victims taken before)."""
    decision = decide(state, NOW)
    quotas_by_name = {q.name: q for q in state.quotas}
    pending_by_id = {j.id: j for j in state.pending}
    running_by_id = {j.id: j for j in state.running}
    most = logical_start(state)
    for job_id in [*decision.admit, *(p.id for p in decision.pending if p.reason.startswith("waiting for"))]:
        most[pending_by_id[job_id].quota] += pending_by_id[job_id].gpus
    parents = {c.name: c.parent for c in state.cohorts}
    for preemption in decision.preempt:
        victim, preemptor = running_by_id[preemption.id], pending_by_id[preemption.for_]
        if victim.quota != preemptor.quota:
            figures = tree_figures(most, quotas_by_name, state.capacity, state.cohorts)
            assert most[victim.quota] > quotas_by_name[victim.quota].capacity, preemption
            node = quotas_by_name[victim.quota].cohort
            while node is not None and not _under(state.cohorts, quotas_by_name[preemptor.quota].cohort, node):
                assert figures[node].used > figures[node].share, (preemption, node)
                node = parents[node]
        most[victim.quota] -= victim.gpus


@given(states(tree=True), st.randoms())
def test_with_cohorts_the_same_input_always_gives_the_same_decision(state, rng: random.Random):
    decision = decide(state, NOW).to_dict()
    shuffled_running, shuffled_pending = list(state.running), list(state.pending)
    rng.shuffle(shuffled_running)
    rng.shuffle(shuffled_pending)
    assert decide(replace(state, running=tuple(shuffled_running), pending=tuple(shuffled_pending)), NOW).to_dict() == decision


# -- hosts (DESIGN §2, hosts) -----------------------------------------------------------------------


@st.composite
def host_states(draw, *, tree: bool = False) -> State:
    """A queue with 1-4 hosts of 1-8 GPUs (summing to at most its capacity: the rest is lost hosts),
    each running job on a host with room for it, a preemptor's stopping victims on any hosts; with
    ``tree``, its quotas in cohorts."""
    quota_list = draw(quotas())
    cohorts: tuple[Cohort, ...] = ()
    if tree:
        cohorts, quota_list = draw(cohort_trees(quota_list))
    by_name = {q.name: q for q in quota_list}
    hosts = tuple(Host(f"h{index}", draw(st.integers(1, 8))) for index in range(draw(st.integers(1, 4))))
    owned = sum(q.capacity for q in quota_list) + sum(c.capacity for c in cohorts)
    capacity = max(1, owned + draw(st.integers(0, 4)), sum(h.gpus for h in hosts))
    on_host = dict.fromkeys((h.name for h in hosts), 0)
    used = dict.fromkeys(by_name, 0)
    running = []
    for index in range(draw(st.integers(0, 12))):
        name = draw(st.sampled_from(sorted(by_name)))
        gpus = draw(st.integers(1, 4))
        host = draw(st.sampled_from(hosts))
        preempted_for = f"p{draw(st.integers(0, 7))}" if draw(st.integers(0, 5)) == 0 else None
        trial = dict(used, **{name: used[name] + gpus})
        if on_host[host.name] + gpus > host.gpus:
            continue
        if preempted_for is None and not balanced(trial, by_name, capacity, cohorts=cohorts):
            continue
        on_host[host.name] += gpus
        if preempted_for is None:
            used = trial
        running.append(
            Job(
                id=f"r{index}",
                quota=name,
                gpus=gpus,
                priority=draw(st.integers(0, 5)),
                submitted_at=float(draw(st.integers(0, 50))),
                started_at=float(draw(st.integers(0, 100))),
                preemptible=draw(st.booleans()),
                preemptions=draw(st.integers(0, 3)),
                preempted_for=preempted_for,
                host=host.name,
            )
        )
    pending = draw(pending_jobs(sorted(by_name), max_gpus=9))
    return State(capacity, quota_list, tuple(running), tuple(pending), hosts, cohorts)


_HELD_ON = re.compile(r"GPUs on (\S+?)[: ]")


def settled_on_hosts(state: State, decision) -> dict[str, int]:
    """GPUs each host holds once every stopping job is gone and every held job runs where it waits."""
    stopping = {p.id for p in decision.preempt} | {j.id for j in state.running if j.preempted_for is not None}
    held = dict.fromkeys((h.name for h in state.hosts), 0)
    for job in state.running:
        if job.id not in stopping:
            held[job.host] += job.gpus
    jobs = {job.id: job for job in state.pending}
    for job_id, host in decision.hosts.items():
        held[host] += jobs[job_id].gpus
    for pending in decision.pending:
        if pending.reason.startswith("waiting for"):
            held[_HELD_ON.search(pending.reason).group(1)] += jobs[pending.id].gpus
    return held


@given(host_states())
def test_no_host_ever_holds_more_gpus_than_it_has(state):
    decision = decide(state, NOW)
    assert set(decision.hosts) == set(decision.admit), "every admitted job has a host"
    gpus = {h.name: h.gpus for h in state.hosts}
    now = dict.fromkeys(gpus, 0)
    for job in state.running:
        now[job.host] += job.gpus
    jobs = {job.id: job for job in state.pending}
    for job_id, host in decision.hosts.items():
        assert jobs[job_id].gpus <= gpus[host], (job_id, host)
        now[host] += jobs[job_id].gpus
    assert all(now[name] <= gpus[name] for name in gpus), (now, decision)
    settled = settled_on_hosts(state, decision)
    assert all(settled[name] <= gpus[name] for name in gpus), (settled, decision)


@given(host_states())
def test_quota_capacity_is_never_exceeded_with_hosts(state):
    decision = decide(state, NOW)
    assert balanced(logical_end(state, decision), {q.name: q for q in state.quotas}, state.capacity)


@given(host_states(tree=True))
def test_with_hosts_and_cohorts_no_node_and_no_host_is_exceeded(state):
    decision = decide(state, NOW)
    assert balanced(logical_end(state, decision), {q.name: q for q in state.quotas}, state.capacity, cohorts=state.cohorts)
    gpus = {h.name: h.gpus for h in state.hosts}
    settled = settled_on_hosts(state, decision)
    assert all(settled[name] <= gpus[name] for name in gpus), (settled, decision)


@given(host_states())
def test_no_job_larger_than_the_largest_host_is_admitted_or_waits(state):
    decision = decide(state, NOW)
    largest = max(h.gpus for h in state.hosts)
    rejected = {r.id for r in decision.reject}
    assert all(job.id in rejected for job in state.pending if job.gpus > largest)


@given(st.booleans().flatmap(lambda tree: host_states(tree=tree)))
def test_with_hosts_a_job_has_the_victims_it_has_without_them_unless_placement_forces_more(state):
    """One waiting job, decided with hosts and without (one implicit host of the capacity): where the
    victims it gets without hosts leave room on some host once they and every stopping job are gone,
    and those of its own quota all run there, it gets exactly those victims with hosts (which hosts
    hold other quotas' victims does not matter)."""
    assume(state.pending)
    job = state.pending[0]
    state = replace(state, pending=(job,))
    plain = decide(replace(state, hosts=None, running=tuple(replace(j, host=None) for j in state.running)), NOW)
    victims = {p.id for p in plain.preempt}
    room = {h.name: h.gpus for h in state.hosts}
    for running in state.running:
        if running.preempted_for is None and running.id not in victims:
            room[running.host] -= running.gpus
    own = {r.host for r in state.running if r.id in victims and r.quota == job.quota}
    placed = decide(state, NOW)
    if any(free >= job.gpus and own <= {name} for name, free in room.items()):
        assert {p.id for p in placed.preempt} == victims, (plain, placed)
    assert [p.to_dict() for p in decide(state, NOW).preempt] == [p.to_dict() for p in placed.preempt]


def shuffled(state: State, rng: random.Random) -> State:
    """``state`` with its running jobs, waiting jobs and hosts each in another order."""
    lists = [list(state.running), list(state.pending), list(state.hosts)]
    for items in lists:
        rng.shuffle(items)
    return replace(state, running=tuple(lists[0]), pending=tuple(lists[1]), hosts=tuple(lists[2]))


@given(host_states(), st.randoms())
def test_with_hosts_the_same_input_always_gives_the_same_decision(state, rng: random.Random):
    decision = decide(state, NOW).to_dict()
    assert decide(shuffled(state, rng), NOW).to_dict() == decision


@given(states())
def test_one_host_of_the_whole_capacity_decides_as_no_hosts(state):
    """Without hosts the queue is one implicit host of its capacity: naming that host changes nothing
    but where the decision says the admitted jobs start (and the words of some reasons)."""
    plain = decide(state, NOW)
    one = replace(state, hosts=(Host("all", state.capacity),), running=tuple(replace(j, host="all") for j in state.running))
    placed = decide(one, NOW)
    assert placed.admit == plain.admit and placed.hosts == dict.fromkeys(plain.admit, "all")
    assert [p.to_dict() for p in placed.preempt] == [p.to_dict() for p in plain.preempt]
    assert [r.to_dict() for r in placed.reject] == [r.to_dict() for r in plain.reject]
    assert [(p.id, p.position) for p in placed.pending] == [(p.id, p.position) for p in plain.pending]
