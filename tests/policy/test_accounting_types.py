"""Usage accounting per GPU type (issue 33): each type of a job queue is accounted as its own untyped
queue, quotas' figures are the sums over the types, and a price per type turns GPU-hours into cost."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from airflow_quota_provider.policy import Queue, Quota
from airflow_quota_provider.policy.accounting import (
    Config,
    Event,
    Hold,
    account,
    account_history,
    costs,
    holds_from_events,
    period_cuts,
    totals,
)
from airflow_quota_provider.policy.config import parse_quota_file, queue_to_dict
from airflow_quota_provider.policy.errors import PolicyError
from airflow_quota_provider.policy.types import GpuType

from tests.policy.test_accounting import QUEUES, reference, scenarios

KINDS = ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost")

TYPED = parse_quota_file({"queues": [{
    "name": "fleet",
    "capacity": {"h100": 6, "l4": 8},
    "gpu_hour_price": {"h100": 4.0, "l4": 0.5},
    "quotas": [
        {"name": "a", "capacity": {"h100": 2, "l4": 4}, "lend_limit": {"h100": 1}},
        {"name": "b", "capacity": {"h100": 2, "l4": 2}, "borrow_limit": {"l4": 2}},
        {"name": "c", "capacity": {"h100": 1}, "sharing": "lend"},
    ],
}]}).queues[0]


def one_type(queue: Queue, name: str = "x") -> Queue:
    """``queue`` as a job queue with one GPU type of the same capacities."""
    return replace(queue, types=(GpuType(name, queue.capacity, queue.quotas, queue.cohorts),))


def test_a_borrowed_h100_is_not_covered_by_idle_l4s():
    """Summed over types, quota a holding 4 H100s is within its 6 GPUs; per type it borrows 2 H100s
    (lent by b and the pool) while its 4 L4s sit idle."""
    result = account([TYPED], [Hold("1", "a", 4, 0, 100, "d", gpu_type="h100")], period_cuts(0, 100))
    h100, l4 = result.quota_types[(0, "a", "h100")], result.quota_types[(0, "a", "l4")]
    assert (h100.used_within, h100.borrowed, h100.idle) == (200, 200, 0)
    assert (l4.used_within, l4.borrowed, l4.idle) == (0, 0, 400)
    summed = result.quotas[(0, "a")]
    assert (summed.capacity_s, summed.used_within, summed.borrowed) == (600, 200, 200)
    assert totals(result, per_type=True)[("a", "h100")].borrowed == 200


@st.composite
def typed_scenarios(draw):
    names = [q.name for q in TYPED.quotas]
    holds = []
    for i in range(draw(st.integers(0, 10))):
        start = draw(st.integers(-5, 40))
        end = draw(st.one_of(st.none(), st.integers(start + 1, 50)))
        holds.append(Hold(str(i), draw(st.sampled_from(names)), draw(st.integers(1, 4)), start, end,
                          draw(st.sampled_from(["d1", "d2"])), draw(st.booleans()),
                          draw(st.one_of(st.none(), st.integers(-5, 45))), draw(st.sampled_from(["h100", "l4"]))))
    cut = draw(st.integers(1, 39))
    return holds, [(0, cut), (cut, 40)]


@settings(max_examples=150, deadline=None)
@given(typed_scenarios())
def test_each_gpu_type_is_conserved_and_accounted_as_its_own_untyped_queue(scenario):
    """Per quota, type and period used_within + lent + idle = C_type x T, each figure the reference's
    for that type's untyped queue and its holds; a quota's figures are the sums over its types."""
    holds, periods = scenario
    result = account([TYPED], holds, periods)
    for period in periods:
        span = period[1] - period[0]
        for gpu_type in TYPED.types:
            alone = Queue(TYPED.name, gpu_type.capacity, gpu_type.quotas)
            want, _ = reference(alone, [h for h in holds if h.gpu_type == gpu_type.name], period)
            for quota in gpu_type.quotas:
                got = result.quota_types[(period[0], quota.name, gpu_type.name)]
                assert got.capacity_s == quota.capacity * span
                assert got.used_within + got.lent + got.idle == pytest.approx(quota.capacity * span)
                for kind, value in want[quota.name].items():
                    assert getattr(got, kind) == pytest.approx(value), (quota.name, gpu_type.name, kind)
        for quota in TYPED.quotas:
            summed = result.quotas[(period[0], quota.name)]
            for kind in KINDS:
                per_type = sum(getattr(result.quota_types[(period[0], quota.name, t.name)], kind) for t in TYPED.types)
                assert getattr(summed, kind) == pytest.approx(per_type)
        for dag_id in ("d1", "d2"):
            for quota in TYPED.quotas:
                shares = [f for (p, q, _, d), f in result.dag_types.items() if (p, q, d) == (period[0], quota.name, dag_id)]
                summed = result.dags.get((period[0], quota.name, dag_id))
                assert sum(f.used_within for f in shares) == pytest.approx(summed.used_within if summed else 0)


@settings(max_examples=150, deadline=None)
@given(scenarios())
def test_an_untyped_queue_is_accounted_as_before_and_as_one_gpu_type(scenario):
    """An untyped queue's figures are exactly those of the same queue with one GPU type of the same
    capacities (its holds of that type), and its per-type figures are its quotas' under type None."""
    queue, holds, periods = scenario
    untyped = account([queue], holds, periods)
    typed = account([one_type(queue)], [h._replace(gpu_type="x") for h in holds], periods)
    assert (typed.quotas, typed.dags, typed.pools) == (untyped.quotas, untyped.dags, untyped.pools)
    assert untyped.quota_types == {(p, q, None): f for (p, q), f in untyped.quotas.items()}
    assert untyped.dag_types == {(p, q, None, d): f for (p, q, d), f in untyped.dags.items()}
    assert totals(untyped, per_type=True) == {(q, None): f for q, f in totals(untyped).items()}


def test_a_hold_without_a_type_is_charged_to_the_first_type_and_one_of_a_removed_type_is_left_out():
    holds = [Hold("1", "a", 2, 0, 10, "d"), Hold("2", "b", 3, 0, 10, "d", gpu_type="a100")]
    result = account([TYPED], holds, period_cuts(0, 10))
    assert result.quota_types[(0, "a", "h100")].used_within == 20
    assert result.quota_types[(0, "a", "l4")].used_within == 0
    assert result.quotas[(0, "b")].used_within == 0


def test_holds_carry_the_gpu_type_their_admitted_event_names():
    events = [Event(0, "admitted", "1", "a", "d", "0,1", gpu_type="h100"), Event(5, "preempted", "1", "a", "d"),
              Event(8, "released", "1", "a", "d", "0,1"), Event(8, "stopped", "1", "a", "d"),
              Event(9, "admitted", "1", "a", "d", "0", gpu_type="l4")]
    assert holds_from_events(events) == [Hold("1", "a", 2, 0, 8, "d", True, None, "h100"),
                                         Hold("1", "a", 1, 9, None, "d", gpu_type="l4")]


def test_a_price_per_gpu_type_turns_the_charged_gpu_hours_into_cost():
    """Cost = (used_within + borrowed) GPU-hours x the price of each quota and type; lent and idle
    cost nothing, and a DAG pays each type's hours at that type's price."""
    holds = [Hold("1", "a", 4, 0, 3600, "train", gpu_type="h100"), Hold("2", "a", 2, 0, 7200, "train", gpu_type="l4")]
    result = account([TYPED], holds, period_cuts(0, 7200))
    prices = {("a", "h100"): 4.0, ("a", "l4"): 0.5}
    assert costs(result, prices, per_type=True)[("a", "h100")] == pytest.approx(4 * 1 * 4.0)  # 2 within + 2 borrowed
    assert costs(result, prices, per_type=True)[("a", "l4")] == pytest.approx(2 * 2 * 0.5)
    assert costs(result, prices, by="dag") == {"train": pytest.approx(16.0 + 2.0)}
    assert costs(result, {("a", "h100"): 4.0}, by="dag") == {"train": None}  # an unpriced type: no partial sum


def test_a_history_keeps_the_figures_per_gpu_type():
    holds = [Hold("1", "a", 1, 0, 100, "d", gpu_type="l4")]
    periods = period_cuts(0, 100)
    result = account_history([Config(0, [TYPED]), Config(50, [replace(TYPED, gpu_hour_price={})])], holds, periods)
    assert result.quota_types == account([TYPED], holds, periods).quota_types


def test_a_typed_queue_written_back_in_the_file_form_reads_the_same():
    """What the audit log records of the file in force (``config_loaded``) keeps types and prices."""
    assert parse_quota_file({"queues": [queue_to_dict(TYPED)]}).queues[0] == TYPED
    untyped = parse_quota_file({"queues": [{"name": "u", "capacity": 4, "gpu_hour_price": 2.5,
                                            "quotas": [{"name": "x", "capacity": 2}]}]}).queues[0]
    assert untyped.gpu_hour_price == {None: 2.5}
    assert parse_quota_file({"queues": [queue_to_dict(untyped)]}).queues[0] == untyped
    assert parse_quota_file({"queues": [queue_to_dict(QUEUES[2])]}).queues[0] == QUEUES[2]
    with_cohorts = parse_quota_file({"queues": [{
        "name": "tree", "capacity": {"h100": 8, "l4": 8}, "fungibility": {"when_can_preempt": "preempt"},
        "instance_types": {"h100": "ml.p5.48xlarge", "l4": "ml.g6.48xlarge"},
        "quotas": [{"name": "a", "capacity": {"h100": 2, "l4": 4}, "cohort": "ml", "borrow_limit": "50%"},
                   {"name": "b", "capacity": {"h100": 2}, "cohort": "ml", "lend_limit": {"h100": 1}}],
        "cohorts": [{"name": "ml", "capacity": {"l4": 2}, "borrow_limit": {"h100": 2}}],
    }]}).queues[0]
    assert parse_quota_file({"queues": [queue_to_dict(with_cohorts)]}).queues[0] == with_cohorts


@pytest.mark.parametrize(
    ("price", "path", "says"),
    [
        pytest.param(3, "queues[0].gpu_hour_price", "expected a mapping {GPU type: price per GPU-hour} for the GPU types h100, l4",
                     id="a typed queue prices each type"),
        pytest.param({"h100": 4}, "queues[0].gpu_hour_price", "no price for GPU type l4; every one of h100, l4 needs one",
                     id="every type has a price"),
        pytest.param({"h100": 4, "l4": 1, "a100": 2}, "queues[0].gpu_hour_price.a100", "not one of the job queue's GPU types h100, l4",
                     id="only the queue's types"),
        pytest.param({"h100": 4, "l4": -1}, "queues[0].gpu_hour_price.l4", "-1 is below the minimum 0",
                     id="no negative price"),
        pytest.param({"h100": 4, "l4": float("nan")}, "queues[0].gpu_hour_price.l4", "expected a finite number",
                     id="a finite price"),
    ],
)
def test_gpu_hour_price_is_validated_naming_the_field(price, path, says):
    file = {"queues": [{**queue_to_dict(TYPED), "gpu_hour_price": price}]}
    with pytest.raises(PolicyError) as e:
        parse_quota_file(file)
    assert e.value.path == path and says in e.value.message


def test_an_untyped_queue_has_one_price():
    with pytest.raises(PolicyError) as e:
        parse_quota_file({"queues": [{"name": "u", "capacity": 4, "gpu_hour_price": {"x": 1},
                                      "quotas": [{"name": "x", "capacity": 2}]}]})
    assert e.value.path == "queues[0].gpu_hour_price" and "expected a finite number" in e.value.message
