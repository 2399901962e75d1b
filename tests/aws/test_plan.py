"""The quota-share planner, without AWS: a quota file's queue against the shares a job queue lists."""

from __future__ import annotations

import pytest

from airflow_quota_provider.aws.plan import borrow_limit_percent, plan_quota_shares, quota_share_specs
from airflow_quota_provider.policy import PolicyError, parse_quota_file

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
