"""Usage accounting: one table row per rule, and conservation against a second-by-second reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from airflow_quota_provider.policy import Cohort, Queue, Quota
from airflow_quota_provider.policy.accounting import (
    DAY_S,
    Config,
    Event,
    Hold,
    account,
    account_history,
    holds_from_events,
    period_cuts,
    totals,
)
from airflow_quota_provider.policy.capacity import usage_for
from airflow_quota_provider.policy.state import State

FLAT = Queue("fleet", 10, (Quota("team-a", 4), Quota("team-b", 4)))  # a common pool of 2
RESERVED = Queue("fleet", 8, (Quota("team-a", 4), Quota("team-b", 4, sharing="reserve")))


def hold(job, quota, gpus, start, end=None, dag="dag", **fields):
    return Hold(job, quota, gpus, start, end, dag, **fields)


def quota_figures(queue, holds, since=0.0, until=100.0):
    """{quota: {kind: GPU-seconds}} over one period."""
    result = account([queue], holds, period_cuts(since, until))
    return {quota: {k: round(v, 6) for k, v in f.as_dict().items()} for (_, quota), f in result.quotas.items()}


@pytest.mark.parametrize(
    ("queue", "holds", "quota", "want"),
    [
        pytest.param(
            FLAT, [hold("1", "team-a", 3, 10, 60)], "team-a",
            {"capacity_s": 400, "used_within": 150, "borrowed": 0, "lent": 0, "idle": 250, "lost": 0},
            id="a job within its quota uses its capacity; the rest is idle",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 6, 0, 50)], "team-a",
            {"capacity_s": 400, "used_within": 200, "borrowed": 100, "lent": 0, "idle": 200, "lost": 0},
            id="GPUs above capacity are borrowed",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 6, 0, 50)], "team-b",
            {"capacity_s": 400, "used_within": 0, "borrowed": 0, "lent": 0, "idle": 400, "lost": 0},
            id="borrowers draw on the common pool before anyone lends",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 8, 0, 50)], "team-b",
            {"capacity_s": 400, "used_within": 0, "borrowed": 0, "lent": 100, "idle": 300, "lost": 0},
            id="borrowing beyond the common pool is lent by the idle quota",
        ),
        pytest.param(
            RESERVED, [hold("1", "team-a", 4, 0, 100), hold("2", "team-b", 1, 0, 100)], "team-b",
            {"capacity_s": 400, "used_within": 100, "borrowed": 0, "lent": 0, "idle": 300, "lost": 0},
            id="a reserve quota never lends: its unused capacity stays idle",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 2, 0, 50, preempted=True, last_checkpoint_at=30)], "team-a",
            {"capacity_s": 400, "used_within": 100, "borrowed": 0, "lent": 0, "idle": 300, "lost": 40},
            id="preemption loses the GPU time since the last checkpoint",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 2, 10, 50, preempted=True)], "team-a",
            {"capacity_s": 400, "used_within": 80, "borrowed": 0, "lent": 0, "idle": 320, "lost": 80},
            id="preemption without a checkpoint loses the GPU time since the start",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 2, 50)], "team-a",
            {"capacity_s": 400, "used_within": 100, "borrowed": 0, "lent": 0, "idle": 300, "lost": 0},
            id="a job still holding GPUs counts until the end of the period",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 2, -50, 150)], "team-a",
            {"capacity_s": 400, "used_within": 200, "borrowed": 0, "lent": 0, "idle": 200, "lost": 0},
            id="a hold across the period's edges counts only inside it",
        ),
        pytest.param(
            FLAT, [hold("1", "team-a", 4, 0, 50), hold("2", "team-a", 4, 50, 100)], "team-a",
            {"capacity_s": 400, "used_within": 400, "borrowed": 0, "lent": 0, "idle": 0, "lost": 0},
            id="a job released as another is admitted at the same second never borrows",
        ),
        pytest.param(
            FLAT, [hold("1", "team-x", 4, 0, 50)], "team-a",
            {"capacity_s": 400, "used_within": 0, "borrowed": 0, "lent": 0, "idle": 400, "lost": 0},
            id="a quota the file no longer has is left out",
        ),
    ],
)
def test_quota_figures(queue, holds, quota, want):
    assert quota_figures(queue, holds)[quota] == want


def test_a_hold_across_midnight_is_split_between_the_days():
    midnight = 20 * DAY_S
    holds = [hold("1", "team-a", 2, midnight - 3600, midnight + 1800, preempted=True)]
    result = account([FLAT], holds, period_cuts(midnight - DAY_S, midnight + DAY_S, DAY_S))
    before, after = result.quotas[(midnight - DAY_S, "team-a")], result.quotas[(midnight, "team-a")]
    assert (before.used_within, after.used_within) == (2 * 3600, 2 * 1800)
    assert (before.lost, after.lost) == (2 * 3600, 2 * 1800)
    assert before.capacity_s == after.capacity_s == 4 * DAY_S


def test_dags_share_their_quotas_borrowing_in_proportion_to_their_gpus():
    holds = [hold("1", "team-a", 6, 0, 100, dag="big"), hold("2", "team-a", 2, 0, 100, dag="small")]
    by_dag = totals(account([FLAT], holds, period_cuts(0, 100)), by="dag")
    assert (by_dag["big"].used_within, by_dag["big"].borrowed) == pytest.approx((300, 300))
    assert (by_dag["small"].used_within, by_dag["small"].borrowed) == pytest.approx((100, 100))


def test_owners_are_charged_with_their_dags():
    holds = [hold("1", "team-a", 1, 0, 10, dag="d1"), hold("2", "team-b", 1, 0, 20, dag="d2"),
             hold("3", "team-b", 1, 0, 40, dag="orphan")]
    by_owner = totals(account([FLAT], holds, period_cuts(0, 100)), by="owner", owners={"d1": "ml", "d2": "ml"})
    assert {k: v.used_within for k, v in by_owner.items()} == {"ml": 30, "unknown": 40}


def test_cohort_members_lend_to_each_other_before_the_rest_of_the_tree():
    queue = Queue("fleet", 12, (Quota("a", 4, cohort="ml"), Quota("b", 4, cohort="ml"), Quota("c", 4)),
                  cohorts=(Cohort("ml"),))
    figures = quota_figures(queue, [hold("1", "a", 6, 0, 100)])
    assert (figures["b"]["lent"], figures["c"]["lent"]) == (200, 0)


@pytest.mark.parametrize(
    ("events", "want"),
    [
        pytest.param(
            [Event(0, "admitted", "1", "team-a", "d", "0,1"), Event(9, "released", "1", "team-a", "d", "0,1"),
             Event(9, "finished", "1", "team-a", "d")],
            [Hold("1", "team-a", 2, 0, 9, "d")],
            id="admitted to released is one hold of as many GPUs as devices",
        ),
        pytest.param(
            [Event(0, "admitted", "1", "q", "d", "0,1"), Event(0, "admitted", "1", "q", "d", "0,1"),
             Event(5, "preempted", "1", "q", "d"), Event(8, "released", "1", "q", "d", "0,1"),
             Event(8, "released", "1", "q", "d", "0,1"), Event(8, "stopped", "1", "q", "d", checkpoint_at=6.0),
             Event(20, "admitted", "1", "q", "d", "2,3"), Event(20, "admitted", "1", "q", "d", "0,1")],
            [Hold("1", "q", 4, 0, 8, "d", True, 6.0), Hold("1", "q", 4, 20, None, "d")],
            id="a gang's nodes (one admitted and one released per host) are one hold of every node's GPUs",
        ),
        pytest.param(
            [Event(0, "admitted", "1", "q", "d", "0"), Event(5, "preempted", "1", "q", "d"),
             Event(8, "released", "1", "q", "d", "0"), Event(8, "stopped", "1", "q", "d"),
             Event(20, "admitted", "1", "q", "d", "3")],
            [Hold("1", "q", 1, 0, 8, "d", True), Hold("1", "q", 1, 20, None, "d")],
            id="a preempted hold that stopped lost its work; the next admission opens a new hold",
        ),
        pytest.param(
            [Event(0, "admitted", "1", "q", "d", "0"), Event(5, "preempted", "1", "q", "d"),
             Event(8, "released", "1", "q", "d", "0"), Event(8, "stopped", "1", "q", "d", checkpoint_at=6.5)],
            [Hold("1", "q", 1, 0, 8, "d", True, 6.5)],
            id="a preempted hold lost only the work since the checkpoint its stopped event names",
        ),
        pytest.param(
            [Event(0, "admitted", "1", "q", "d", "0"), Event(5, "preempted", "1", "q", "d"),
             Event(7, "released", "1", "q", "d", "0"), Event(7, "finished", "1", "q", "d")],
            [Hold("1", "q", 1, 0, 7, "d")],
            id="a victim that finished within its grace period lost nothing",
        ),
        pytest.param(
            [Event(0, "admitted", "1", "q", "d", "0"), Event(5, "preempted", "1", "q", "d"),
             Event(7, "released", "1", "q", "d", "0")],
            [Hold("1", "q", 1, 0, 7, "d", True)],
            id="a victim failed past its preemption limit writes nothing more and lost its work",
        ),
    ],
)
def test_holds_from_events(events, want):
    assert holds_from_events(events) == want


def test_until_must_be_after_since():
    with pytest.raises(ValueError, match="until"):
        period_cuts(10, 10)


# --------------------------------------------------------------------------------------------------
# History: each moment charged with the quota file in force then.

GROWN = Queue("fleet", 10, (Quota("team-a", 8), Quota("team-b", 2)))  # team-a's capacity raised from 4 to 8


def history_figures(configs, holds, periods):
    result = account_history(configs, holds, periods)
    return {key: {k: round(v, 6) for k, v in f.as_dict().items()} for key, f in result.quotas.items()}


def test_a_fresh_install_is_charged_idle_only_since_its_first_configuration():
    """Installed at 1000 s, reported from the epoch to 180 s later: 180 s of idle capacity, not 1180 s."""
    got = history_figures([Config(1000, [FLAT])], [], period_cuts(0, 1180))
    assert got[(0, "team-a")] == {"capacity_s": 4 * 180, "used_within": 0, "borrowed": 0, "lent": 0,
                                  "idle": 4 * 180, "lost": 0}
    assert account_history([Config(1000, [FLAT])], [], period_cuts(0, 1000)).quotas == {}


def test_each_part_of_a_period_is_charged_with_the_capacity_then_in_force():
    """team-a holds 6 GPUs throughout; at 500 s its capacity goes from 4 to 8: 4 within and 2 borrowed
    before, 6 within after, and capacity (so idle) 4 then 8, all inside the period from 400 to 800 s."""
    holds = [hold("1", "team-a", 6, 0, 1000)]
    got = history_figures([Config(0, [FLAT]), Config(500, [GROWN])], holds, period_cuts(0, 1000, 400))
    assert got[(400, "team-a")] == {"capacity_s": 4 * 100 + 8 * 300, "used_within": 4 * 100 + 6 * 300,
                                    "borrowed": 2 * 100, "lent": 0, "idle": 2 * 300, "lost": 0}
    assert got[(0, "team-a")]["capacity_s"] == 4 * 400 and got[(800, "team-a")]["capacity_s"] == 8 * 200
    # team-b lent 2 of its 4 to team-a before the change; after it, it has 2 and lends none.
    assert got[(400, "team-b")] == {"capacity_s": 4 * 100 + 2 * 300, "used_within": 0, "borrowed": 0,
                                    "lent": 0 * 100, "idle": 4 * 100 + 2 * 300, "lost": 0}


def test_a_quota_is_charged_only_while_a_quota_file_in_force_has_it():
    solo = Queue("fleet", 10, (Quota("team-a", 4),))
    got = history_figures([Config(0, [solo]), Config(300, [FLAT]), Config(700, [solo])], [], period_cuts(0, 1000))
    assert (got[(0, "team-a")]["capacity_s"], got[(0, "team-b")]["capacity_s"]) == (4 * 1000, 4 * 400)


def test_a_reload_of_the_same_file_charges_what_one_configuration_does():
    holds = [hold("1", "team-a", 6, 100, 900, preempted=True), hold("2", "team-b", 3, 50)]
    periods = period_cuts(0, 1000, 300)
    once = account([FLAT], holds, periods)
    again = account_history([Config(0, [FLAT]), Config(450, [FLAT]), Config(451, [FLAT])], holds, periods)
    assert (again.quotas, again.dags, again.pools) == (once.quotas, once.dags, once.pools)


# --------------------------------------------------------------------------------------------------
# Conservation, against a reference that applies the definitions second by second.

QUEUES = [
    FLAT,
    Queue("fleet", 12, (Quota("a", 5, lend_limit=2), Quota("b", 3, borrow_limit=2), Quota("c", 2, sharing="lend"))),
    Queue("fleet", 12, (Quota("a", 4, cohort="ml"), Quota("b", 3, cohort="ml"), Quota("c", 3)),
          cohorts=(Cohort("ml", capacity=1),)),
]


@st.composite
def scenarios(draw):
    queue = draw(st.sampled_from(QUEUES))
    names = [q.name for q in queue.quotas]
    holds = []
    for i in range(draw(st.integers(0, 8))):
        start = draw(st.integers(-5, 40))
        end = draw(st.one_of(st.none(), st.integers(start + 1, 50)))
        holds.append(Hold(str(i), draw(st.sampled_from(names)), draw(st.integers(1, 4)), start, end,
                          draw(st.sampled_from(["d1", "d2"])), draw(st.booleans()), draw(st.one_of(st.none(), st.integers(-5, 45)))))
    cut = draw(st.integers(1, 39))
    return queue, holds, [(0, cut), (cut, 40)]


def _proportional_lent(queue, usage):
    """Flat queues: what borrowers hold beyond the common pool, shared in exact proportion to offers."""
    from airflow_quota_provider.policy.capacity import lendable

    offers = {q.name: lendable(q, usage.used[q.name]) for q in queue.quotas}
    common = queue.capacity - sum(q.capacity for q in queue.quotas)
    drawn = sum(max(0, usage.used[q.name] - q.capacity) for q in queue.quotas) - common
    supply = sum(offers.values())
    if drawn <= 0 or supply == 0:
        return dict.fromkeys(offers, 0)
    return {name: offer * min(drawn, supply) / supply for name, offer in offers.items()}


def reference(queue, holds, period):
    """The definitions applied second by second over integer times."""
    start, end = period
    out = {q.name: dict.fromkeys(("used_within", "borrowed", "lent", "idle", "lost"), 0) for q in queue.quotas}
    drawn = 0
    for t in range(start, end):
        usage = usage_for(State.for_queue(queue, (), ()))
        for h in holds:
            if h.start <= t < (h.end if h.end is not None else 10**9):
                usage.add(h.quota, h.gpus)
                saved = h.last_checkpoint_at if h.last_checkpoint_at is not None else h.start
                if h.preempted and h.end is not None and t >= saved and h.quota in out:
                    out[h.quota]["lost"] += h.gpus
        lent = usage.lent() if queue.cohorts else _proportional_lent(queue, usage)
        for q in queue.quotas:
            used = usage.used[q.name]
            out[q.name]["used_within"] += min(used, q.capacity)
            out[q.name]["borrowed"] += max(0, used - q.capacity)
            out[q.name]["lent"] += lent[q.name]
            out[q.name]["idle"] += q.capacity - min(used, q.capacity) - lent[q.name]
        drawn += sum(max(0, usage.used[q.name] - q.capacity) for q in queue.quotas) - sum(lent.values())
    return out, drawn


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_conservation_and_the_definitions_hold_for_every_quota_and_period(scenario):
    queue, holds, periods = scenario
    result = account([queue], holds, periods)
    pool = queue.capacity - sum(q.capacity for q in queue.quotas)
    for period in periods:
        span = period[1] - period[0]
        want, drawn = reference(queue, holds, period)
        for q in queue.quotas:
            got = result.quotas[(period[0], q.name)]
            assert got.used_within + got.lent + got.idle == pytest.approx(q.capacity * span)
            assert got.idle >= -1e-9
            for kind, value in want[q.name].items():
                assert getattr(got, kind) == pytest.approx(value), (q.name, kind)
        borrowed = sum(result.quotas[(period[0], q.name)].borrowed for q in queue.quotas)
        lent = sum(result.quotas[(period[0], q.name)].lent for q in queue.quotas)
        pool_figures = result.pools[(period[0], queue.name)]
        assert borrowed == pytest.approx(lent + pool_figures.drawn)
        assert pool_figures.drawn == pytest.approx(drawn)
        # Each DAG's share adds up to its quota's figures.
        for q in queue.quotas:
            dags = [f for (p, quota, _), f in result.dags.items() if p == period[0] and quota == q.name]
            for kind in ("used_within", "borrowed", "lost"):
                assert sum(getattr(f, kind) for f in dags) == pytest.approx(getattr(result.quotas[(period[0], q.name)], kind))


@settings(max_examples=100, deadline=None)
@given(scenarios(), st.sampled_from(QUEUES[1:]), st.integers(0, 40), st.integers(0, 40))
def test_every_part_of_a_history_matches_the_reference_with_the_file_then_in_force(scenario, later, start, change):
    """From ``start`` one queue, from ``change`` another of the same quotas: each period's figures are
    the reference's over each part with its own queue, and nothing before ``start``."""
    queue, holds, periods = scenario
    if queue is FLAT:  # other quota names than the later queue's
        queue = QUEUES[1]
        holds = [h._replace(quota={"team-a": "a", "team-b": "b"}[h.quota]) for h in holds]
    start, change = min(start, change), max(start, change)
    result = account_history([Config(start, [queue]), Config(change, [later])], holds, periods)
    for period in periods:
        parts = [(q, (max(period[0], lo), min(period[1], hi))) for q, lo, hi in ((queue, start, change), (later, change, 40))]
        parts = [(q, span) for q, span in parts if span[0] < span[1]]
        for name in ("a", "b", "c"):
            got = result.quotas.get((period[0], name))
            if not parts:
                assert got is None
                continue
            for kind in ("used_within", "borrowed", "lent", "idle", "lost"):
                want = sum(reference(q, holds, span)[0][name][kind] for q, span in parts)
                assert getattr(got, kind) == pytest.approx(want), (name, kind)
            capacity = sum(q.quota(name).capacity * (span[1] - span[0]) for q, span in parts)
            assert got.capacity_s == pytest.approx(capacity)
