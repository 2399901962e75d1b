"""The quota-share planner: a quota file's queue against the shares a job queue lists, and a typed
plan applied to the local AWS Batch fake over HTTP."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow_quota_provider.aws.plan import borrow_limit_percent, plan_quota_shares, quota_share_specs
from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook
from airflow_quota_provider.policy import PolicyError, parse_quota_file
from airflow_quota_provider.policy.types import GpuType

UNIT = "ml.p4d.24xlarge"


def queue(*quotas: dict, unit: str | None = UNIT):
    spec = {"name": "training", "capacity": 16, "quotas": list(quotas)}
    if unit:
        spec["capacity_unit"] = unit
    return parse_quota_file({"queues": [spec]}).queues[0]


def listed(name: str, capacity: int, strategy: str = "LEND_AND_BORROW", state: str = "ENABLED") -> dict:
    """A quota share as ListQuotaShares returns it."""
    sharing = {"strategy": strategy, **({"borrowLimit": -1} if strategy == "LEND_AND_BORROW" else {})}
    return {
        "quotaShareName": name,
        "quotaShareArn": f"arn:aws:batch:us-east-1:123456789012:quota-share/{name}",
        "capacityLimits": [{"maxCapacity": capacity, "capacityUnit": UNIT}],
        "resourceSharingConfiguration": sharing,
        "preemptionConfiguration": {"inSharePreemption": "ENABLED"},
        "state": state,
        "status": "VALID",
    }


def test_plan_updates_creates_and_removes_against_the_listed_shares():
    wanted = queue({"name": "team-a", "capacity": 8}, {"name": "team-b", "capacity": 4}, {"name": "team-c", "capacity": 4})
    shares = [listed("team-a", 8), listed("team-b", 2), listed("gone", 4)]

    plan = plan_quota_shares("training", wanted, shares)

    assert [(c.action, c.name) for c in plan.changes] == [
        ("disable", "gone"),
        ("delete", "gone"),
        ("update", "team-b"),
        ("create", "team-c"),
    ]
    assert plan.unchanged == ("team-a",)
    assert plan.changes[2].request["capacityLimits"] == [{"maxCapacity": 4, "capacityUnit": UNIT}]


def test_a_matching_queue_plans_nothing():
    plan = plan_quota_shares("training", queue({"name": "team-a", "capacity": 8}), [listed("team-a", 8)])
    assert plan.empty
    assert "nothing to change" in plan.render()


def test_reserve_quota_may_keep_any_reclaim_setting():
    reserved = queue({"name": "team-a", "capacity": 8, "sharing": "reserve", "preemption": {"reclaim": "never"}})
    assert quota_share_specs(reserved)[0].strategy == "RESERVE"


def test_capacity_unit_is_required_for_aws():
    with pytest.raises(PolicyError, match=r"^queues\[0\].capacity_unit: required for the aws-batch backend"):
        quota_share_specs(queue({"name": "team-a", "capacity": 8}, unit=None), path="queues[0]")


@pytest.mark.parametrize(
    ("borrow_limit", "capacity", "percent"),
    [(None, 8, -1), (0, 8, 0), (4, 8, 50), (8, 8, 100), (16, 8, 200), (1, 100, 1), (3, 4, 75)],
)
def test_borrow_limit_as_a_percentage_of_capacity(borrow_limit, capacity, percent):
    assert borrow_limit_percent(borrow_limit, capacity, "x") == percent


def test_borrow_limit_on_a_zero_capacity_quota_is_refused():
    with pytest.raises(PolicyError, match="percentage of the quota's capacity, which is 0"):
        borrow_limit_percent(2, 0, "x")


# ------------------------------------------------------------------ GPU types: one capacity limit per type

INSTANCE_TYPES = {
    "h100": "ml.p5.48xlarge",
    "a100": "ml.p4d.24xlarge",
    "l4": "ml.g6.48xlarge",
    "l40s": "ml.g6e.48xlarge",
    "a10g": "ml.g5.48xlarge",
    "v100": "ml.p3dn.24xlarge",
}


def typed_queue(types: list[str], *quotas: dict, instance_types: dict | None = None):
    """A queue of 8 GPUs per type; ``instance_types`` defaults to an instance type for each."""
    mapping = {name: INSTANCE_TYPES[name] for name in types} if instance_types is None else instance_types
    spec = {"name": "training", "capacity": {name: 8 for name in types}, "quotas": list(quotas), "instance_types": mapping}
    return parse_quota_file({"queues": [spec]}).queues[0]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 5])
def test_a_typed_queue_gives_each_share_one_capacity_limit_per_type(count):
    types = list(INSTANCE_TYPES)[:count]
    first = types[0]
    wanted = typed_queue(types, {"name": "team-a", "capacity": {first: 6}}, {"name": "team-b", "capacity": {first: 2}})

    specs = quota_share_specs(wanted)

    assert [spec.name for spec in specs] == ["team-a", "team-b"]
    assert specs[0].capacity_limits == tuple((INSTANCE_TYPES[t], 6 if t == first else 0) for t in types)
    assert specs[1].capacity_limits_api()[0] == {"maxCapacity": 2, "capacityUnit": INSTANCE_TYPES[first]}


def test_six_capacity_limits_are_refused_naming_the_types():
    five = typed_queue(list(INSTANCE_TYPES)[:5], {"name": "team-a", "capacity": {"h100": 8}})
    extra = GpuType("v100", 8, tuple(replace(q, capacity=0) for q in five.types[0].quotas))
    six = replace(five, types=(*five.types, extra), instance_types=INSTANCE_TYPES)

    with pytest.raises(PolicyError, match=r"^q\.capacity: 6 GPU types \(h100, a100, l4, l40s, a10g, v100\); an AWS "
                       r"Batch quota share holds at most 5 capacity limits"):
        quota_share_specs(six, path="q")


def test_a_type_without_an_instance_type_is_refused_naming_it():
    wanted = typed_queue(["h100", "a100"], {"name": "team-a", "capacity": {"h100": 8}}, instance_types={"h100": "ml.p5.48xlarge"})
    with pytest.raises(PolicyError, match=r"^q\.instance_types: no instance type for GPU type\(s\) a100"):
        quota_share_specs(wanted, path="q")


def test_two_types_in_one_instance_type_are_refused():
    wanted = typed_queue(["h100", "a100"], {"name": "team-a", "capacity": {"h100": 8}},
                         instance_types={"h100": "ml.p5.48xlarge", "a100": "ml.p5.48xlarge"})
    with pytest.raises(PolicyError, match=r"ml\.p5\.48xlarge is given to several GPU types"):
        quota_share_specs(wanted, path="q")


@pytest.mark.parametrize(
    ("borrow_limit", "percent"),
    [("50%", 50), ("0%", 0), ("200%", 200), (None, -1), ({"h100": 2, "a100": 1}, 50)],
)
def test_a_typed_borrow_limit_is_one_percentage_for_every_type(borrow_limit, percent):
    quota = {"name": "team-a", "capacity": {"h100": 4, "a100": 2}, "borrow_limit": borrow_limit}
    [spec] = quota_share_specs(typed_queue(["h100", "a100"], quota))
    assert spec.borrow_limit == percent
    assert spec.resource_sharing_api() == {"strategy": "LEND_AND_BORROW", "borrowLimit": percent}


def test_a_type_the_quota_has_none_of_fits_any_percentage():
    quota = {"name": "team-a", "capacity": {"h100": 4}, "borrow_limit": "50%"}
    [spec] = quota_share_specs(typed_queue(["h100", "a100"], quota))
    assert spec.borrow_limit == 50
    assert spec.capacity_limits == (("ml.p5.48xlarge", 4), ("ml.p4d.24xlarge", 0))


def test_per_type_borrow_limits_of_different_percentages_are_refused_naming_the_types():
    quota = {"name": "team-a", "capacity": {"h100": 4, "a100": 4}, "borrow_limit": {"h100": 2, "a100": 4}}
    with pytest.raises(PolicyError, match=r"^q\.quotas\[0\]\.borrow_limit: AWS Batch applies one borrowLimit percentage "
                       r"to every instance type of a share, but the types differ \(h100 50%, a100 100%\)"):
        quota_share_specs(typed_queue(["h100", "a100"], quota), path="q")


def test_a_per_type_borrow_limit_left_unlimited_on_one_type_is_refused():
    quota = {"name": "team-a", "capacity": {"h100": 4, "a100": 4}, "borrow_limit": {"h100": 2}}
    with pytest.raises(PolicyError, match=r"the types differ \(h100 50%, a100 unlimited\)"):
        quota_share_specs(typed_queue(["h100", "a100"], quota), path="q")


def test_a_per_type_borrow_limit_that_is_no_whole_percentage_names_the_type():
    quota = {"name": "team-a", "capacity": {"h100": 3, "a100": 4}, "borrow_limit": {"h100": 1, "a100": 2}}
    with pytest.raises(PolicyError, match=r"^q\.quotas\[0\]\.borrow_limit\.h100: 1 is 33\.33% of the quota's capacity 3"):
        quota_share_specs(typed_queue(["h100", "a100"], quota), path="q")


def test_typed_shares_listed_in_another_order_plan_nothing():
    wanted = typed_queue(["h100", "a100"], {"name": "team-a", "capacity": {"h100": 8, "a100": 2}})
    share = listed("team-a", 0)
    share["capacityLimits"] = [
        {"maxCapacity": 2, "capacityUnit": "ml.p4d.24xlarge"},
        {"maxCapacity": 8, "capacityUnit": "ml.p5.48xlarge"},
    ]
    assert plan_quota_shares("training", wanted, [share]).empty


def test_a_typed_plan_applied_through_the_fake_holds_one_limit_per_type_and_plans_nothing_again(aws_fake):  # noqa: F811
    wanted = typed_queue(
        ["h100", "a100"],
        {"name": "team-a", "capacity": {"h100": 6, "a100": 2}, "borrow_limit": "50%"},
        {"name": "team-b", "capacity": {"h100": 2, "a100": 6}, "sharing": "reserve"},
    )
    hook = BatchQuotaShareHook(aws_conn_id="aws_default")

    plan = hook.plan_quota_shares(JOB_QUEUE, wanted)
    assert "create  team-a (capacity 6 ml.p5.48xlarge, 2 ml.p4d.24xlarge; LEND_AND_BORROW borrowLimit 50%" in plan.render()
    hook.apply_plan(plan, waiter_delay=0)

    held = {share.name: share.to_api(with_tags=False) for share in aws_fake.shares.values()}
    assert held["team-a"]["capacityLimits"] == [
        {"maxCapacity": 6, "capacityUnit": "ml.p5.48xlarge"},
        {"maxCapacity": 2, "capacityUnit": "ml.p4d.24xlarge"},
    ]
    assert held["team-a"]["resourceSharingConfiguration"] == {"strategy": "LEND_AND_BORROW", "borrowLimit": 50}
    assert held["team-b"]["resourceSharingConfiguration"] == {"strategy": "RESERVE"}
    assert hook.plan_quota_shares(JOB_QUEUE, wanted).empty
    assert {row["unit"]: row["capacity"] for row in hook.quota_share_usage(JOB_QUEUE) if row["quota_share"] == "team-b"} == {
        "ml.p5.48xlarge": 2,
        "ml.p4d.24xlarge": 6,
    }


def with_file_percentage(capacities: dict, percent: float):
    return typed_queue(list(capacities), {"name": "team-a", "capacity": capacities, "borrow_limit": f"{percent:g}%"})


def test_the_files_own_percentage_goes_as_it_is_on_any_capacity():
    # 50% of 3 H100s is 1 GPU to the local policy (33%), but AWS Batch applies the file's 50% itself.
    assert quota_share_specs(with_file_percentage({"h100": 3, "a100": 2}, 50.0))[0].borrow_limit == 50


def test_a_percentage_with_a_fraction_is_refused():
    with pytest.raises(PolicyError, match=r"^q\.quotas\[0\]\.borrow_limit: 12\.5%: AWS Batch's borrowLimit is a whole"):
        quota_share_specs(with_file_percentage({"h100": 8, "a100": 8}, 12.5), path="q")
