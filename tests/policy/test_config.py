"""The quota file: what it accepts, its defaults, and errors that name the field and allowed values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from airflow_quota_provider.policy import (
    Cohort,
    PolicyError,
    PreemptionPolicy,
    Quota,
    load_quota_file,
    parse_quota_file,
    quota_to_dict,
)
from airflow_quota_provider.policy.config import MAX_COHORT_DEPTH, cohort_to_dict, parse_cohort, parse_quota

EXAMPLE = Path(__file__).parents[2] / "examples" / "quotas.yaml"


def one_queue(*quotas: dict, capacity: int = 16) -> dict:
    return {"queues": [{"name": "gpu-fleet", "capacity": capacity, "quotas": list(quotas)}]}


def test_the_example_file_parses_with_its_values():
    quota_file = load_quota_file(EXAMPLE)
    (queue,) = quota_file.queues
    assert (queue.name, queue.capacity, [q.name for q in queue.quotas]) == ("gpu-fleet", 8, ["team-a", "team-b", "inference"])
    team_b = quota_file.quota("team-b")
    assert team_b.preemption == PreemptionPolicy("lower_priority", "lower_priority", 20)
    assert team_b.min_runtime_s == 10
    assert quota_file.queue_of("inference") is queue


def test_everything_but_name_and_capacity_has_a_default():
    quota = parse_quota({"name": "team-a", "capacity": 4}, "q")
    assert quota == Quota(name="team-a", capacity=4)
    assert (quota.sharing, quota.preemption.within_quota, quota.preemption.reclaim) == ("lend_and_borrow", "lower_priority", "any")
    assert (quota.max_preemptions, quota.on_preemption_limit, quota.weight) == (None, "fail", 1.0)


def test_quota_to_dict_round_trips():
    for quota in load_quota_file(EXAMPLE).queues[0].quotas:
        assert parse_quota(quota_to_dict(quota), "q") == quota


def test_teams_map_onto_quotas():
    quota_file = parse_quota_file(one_queue({"name": "team-a", "capacity": 8, "teams": ["itp01", "itp02"]}, {"name": "itp03", "capacity": 8}))
    assert quota_file.quota_for_team("itp02") == "team-a"
    assert quota_file.quota_for_team("itp03") == "itp03"
    assert quota_file.quota_for_team("itp09") is None


BAD = [
    pytest.param(
        one_queue({"name": "a", "capacity": 4}, {"name": "b", "capacity": 4}, {"name": "c", "capacity": 4}, {"name": "d", "capacity": 4, "sharing": "lend-borrow"}),
        "queues[0].quotas[3].sharing: 'lend-borrow' is not one of reserve, lend, lend_and_borrow",
        id="sharing names its allowed values",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "preemption": {"reclaim": "sometimes"}}),
        "queues[0].quotas[0].preemption.reclaim: 'sometimes' is not one of never, lower_priority, any",
        id="reclaim names its allowed values",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "preemption": {"within_quota": "lower"}}),
        "queues[0].quotas[0].preemption.within_quota: 'lower' is not one of never, lower_priority, lower_or_newer_equal_priority",
        id="within_quota names its allowed values",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "on_preemption_limit": "retry"}),
        "queues[0].quotas[0].on_preemption_limit: 'retry' is not one of fail, protect",
        id="on_preemption_limit names its allowed values",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "capacty": 4}),
        "queues[0].quotas[0].capacty: unknown field",
        id="unknown keys are refused",
    ),
    pytest.param({"queues": [], "extra": 1}, "queues: at least one job queue is required", id="no queues"),
    pytest.param(
        one_queue(*({"name": f"q{i}", "capacity": 1} for i in range(21)), capacity=32),
        "queues[0].quotas: 21 quotas, more than the limit of 20 per job queue",
        id="more than 20 quotas per job queue",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 10}, {"name": "b", "capacity": 10}),
        "queues[0].quotas: quota capacities sum to 20, above the job queue's capacity 16",
        id="capacities summing above the queue",
    ),
    pytest.param(one_queue({"name": "a", "capacity": -1}), "queues[0].quotas[0].capacity: -1 is below the minimum 0", id="negative capacity"),
    pytest.param(one_queue({"name": "a", "capacity": 4, "borrow_limit": -2}), "queues[0].quotas[0].borrow_limit: -2 is below the minimum 0", id="negative borrow_limit"),
    pytest.param(one_queue({"name": "a", "capacity": 4, "grace_period_s": -5}), "queues[0].quotas[0].grace_period_s: -5 is below the minimum 0.0", id="negative grace period"),
    pytest.param(one_queue({"name": "a", "capacity": 4, "grace_period_s": 1e12}), "queues[0].quotas[0].grace_period_s: 1000000000000.0 is above the maximum 86400", id="a grace period that would hold a victim's GPUs for good"),
    pytest.param(one_queue({"name": "a", "capacity": 4, "spare_finishing_within_s": -1}), "queues[0].quotas[0].spare_finishing_within_s: -1 is below the minimum 0.0", id="negative spare_finishing_within_s"),
    pytest.param(one_queue({"name": "a", "capacity": "four"}), "queues[0].quotas[0].capacity: expected an integer, got 'four'", id="capacity not a number"),
    pytest.param(
        one_queue({"name": "a", "capacity": 4}, {"name": "a", "capacity": 4}),
        "queues[0].quotas[1].name: duplicate quota name 'a'",
        id="duplicate quota names",
    ),
    pytest.param(
        {"queues": [{"name": "q1", "capacity": 4, "quotas": [{"name": "a", "capacity": 4}]}, {"name": "q2", "capacity": 4, "quotas": [{"name": "a", "capacity": 4}]}]},
        "queues[1].quotas[0].name: quota 'a' is already defined at queues[0].quotas[0]",
        id="a quota name is unique across job queues (it is also a pool name)",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "sharing": "lend", "borrow_limit": 2}),
        "queues[0].quotas[0].borrow_limit: only allowed with sharing lend_and_borrow, not lend",
        id="borrow_limit without borrowing",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "lend_limit": 5}),
        "queues[0].quotas[0].lend_limit: 5 is above the quota's capacity 4",
        id="lend_limit above capacity",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "sharing": "reserve", "lend_limit": 1}),
        "queues[0].quotas[0].lend_limit: not allowed with sharing reserve",
        id="lend_limit on a reserve quota",
    ),
    pytest.param(one_queue({"name": "a", "capacity": 4, "weight": 0}), "queues[0].quotas[0].weight: 0.0 must be above 0", id="zero weight"),
    pytest.param(one_queue({"name": "team a", "capacity": 4}), "queues[0].quotas[0].name: 'team a' is not a valid name", id="names valid as pool and share names"),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "teams": ["x"]}, {"name": "b", "capacity": 4, "teams": ["x"]}),
        "queues[0].quotas[1].teams: team 'x' is already mapped at queues[0].quotas[0]",
        id="a team mapped twice",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "preemption": {"borrow_within": {"max_priority": 5, "x": 1}}}),
        "queues[0].quotas[0].preemption.borrow_within.x: unknown field",
        id="borrow_within takes only max_priority",
    ),
    pytest.param(["not", "a", "mapping"], "expected a mapping", id="top level must be a mapping"),
]


@pytest.mark.parametrize(("data", "message"), BAD)
def test_bad_quota_files_are_refused_naming_the_field(data, message):
    with pytest.raises(PolicyError) as error:
        parse_quota_file(data)
    assert str(error.value).startswith(message) or message in str(error.value)


def test_the_quota_limit_per_queue_is_a_setting():
    data = one_queue(*({"name": f"q{i}", "capacity": 1} for i in range(21)), capacity=32)
    assert len(parse_quota_file(data, max_quotas_per_queue=30).queues[0].quotas) == 21


def test_unknown_quota_names_list_the_known_ones():
    with pytest.raises(PolicyError, match=r"quota: 'team-x' is not one of team-a, team-b, inference"):
        load_quota_file(EXAMPLE).quota("team-x")


def test_unreadable_and_malformed_files_are_policy_errors(tmp_path):
    with pytest.raises(PolicyError, match="cannot read the quota file"):
        load_quota_file(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("queues: [\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_quota_file(bad)


def test_yaml_and_dict_give_the_same_file(tmp_path):
    path = tmp_path / "q.yaml"
    data = one_queue({"name": "a", "capacity": 4, "sharing": "reserve"})
    path.write_text(yaml.safe_dump(data))
    assert load_quota_file(path) == parse_quota_file(data)


# -- hierarchical cohorts ---------------------------------------------------------------------------

TREE = Path(__file__).parents[2] / "examples" / "cohort-quotas.yaml"


def with_cohorts(cohorts: list[dict], *quotas: dict, capacity: int = 16) -> dict:
    data = one_queue(*quotas, capacity=capacity)
    data["queues"][0]["cohorts"] = cohorts
    return data


def test_the_example_tree_parses_with_its_values():
    (queue,) = load_quota_file(TREE).queues
    assert [(c.name, c.parent, c.capacity) for c in queue.cohorts] == [
        ("ml", None, 8), ("research", "ml", 8), ("training", "ml", 0), ("web", None, 0)
    ]
    assert {q.name: q.cohort for q in queue.quotas} == {
        "vision": "research", "language": "research", "batch-train": "training", "serving": "web", "analytics": "web"
    }


def test_a_cohort_needs_only_a_name_and_a_quota_its_cohort():
    (queue,) = parse_quota_file(with_cohorts([{"name": "ml"}], {"name": "a", "capacity": 4, "cohort": "ml"})).queues
    assert queue.cohorts == (Cohort("ml", parent=None, capacity=0, borrow_limit=None, lend_limit=None),)
    assert queue.quotas[0].cohort == "ml"
    assert parse_quota(quota_to_dict(queue.quotas[0]), "q") == queue.quotas[0]
    assert parse_cohort(cohort_to_dict(queue.cohorts[0]), "c") == queue.cohorts[0]


def test_a_file_without_cohorts_has_none_and_writes_no_cohort_field():
    (queue,) = load_quota_file(EXAMPLE).queues
    assert queue.cohorts == () and all(q.cohort is None for q in queue.quotas)
    assert all("cohort" not in quota_to_dict(q) for q in queue.quotas)


BAD_TREES = [
    pytest.param(
        with_cohorts([{"name": "ml", "parent": "web"}, {"name": "web", "parent": "ml"}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[0].parent: cycle: ml -> web -> ml",
        id="a cycle of cohorts names the parent field and the cycle",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "parent": "ml"}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[0].parent: cycle: ml -> ml",
        id="a cohort that is its own parent",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "parent": "org"}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[0].parent: 'org', the parent of cohort 'ml', is not one of ml",
        id="an unknown parent names the cohort and the known cohorts",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "parent": "org"}, {"name": "org", "parent": "top"}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[1].parent: 'top', the parent of cohort 'org', is not one of ml, org",
        id="an unknown parent reached through the chain of an earlier cohort",
    ),
    pytest.param(
        with_cohorts(
            [{"name": "ml", "parent": "org"}, {"name": "org", "parent": "web"}, {"name": "web", "parent": "org"}],
            {"name": "a", "capacity": 4, "cohort": "ml"},
        ),
        "queues[0].cohorts[1].parent: cycle: org -> web -> org",
        id="a cycle above a cohort is named at its first cohort",
    ),
    pytest.param(
        with_cohorts([{"name": "ml"}], {"name": "a", "capacity": 4, "cohort": "web"}),
        "queues[0].quotas[0].cohort: 'web' is not one of ml",
        id="a quota in an unknown cohort",
    ),
    pytest.param(
        one_queue({"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].quotas[0].cohort: 'ml' is not one of none (the file has no cohorts)",
        id="a quota in a cohort of a file without cohorts",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "capacity": 8}], {"name": "a", "capacity": 10, "cohort": "ml"}),
        "queues[0].cohorts: quota and cohort capacities sum to 18, above the job queue's capacity 16",
        id="quota and cohort capacities that do not add up",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "capacity": 2, "lend_limit": 5}], {"name": "a", "capacity": 4, "cohort": "ml", "lend_limit": 2}),
        "queues[0].cohorts[0].lend_limit: 5 is above the 4 GPUs cohort ml can lend (its capacity 2 and what its members lend into it)",
        id="a cohort's lend_limit above what its subtree can lend",
    ),
    pytest.param(
        with_cohorts([{"name": "ml"}, {"name": "web"}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[1].name: cohort 'web' has no quota under it",
        id="a cohort without quotas",
    ),
    pytest.param(
        with_cohorts([{"name": "ml"}, {"name": "ml"}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[1].name: duplicate cohort 'ml'",
        id="duplicate cohort names",
    ),
    pytest.param(
        with_cohorts([{"name": "a"}], {"name": "a", "capacity": 4, "cohort": "a"}),
        "queues[0].cohorts[0].name: duplicate name, also a quota's, 'a'",
        id="a cohort named like a quota",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "weight": 2}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[0].weight: unknown field",
        id="unknown cohort fields are refused",
    ),
    pytest.param(
        with_cohorts([{"name": "ml", "borrow_limit": -1}], {"name": "a", "capacity": 4, "cohort": "ml"}),
        "queues[0].cohorts[0].borrow_limit: -1 is below the minimum 0",
        id="negative cohort borrow_limit",
    ),
]


@pytest.mark.parametrize(("data", "message"), BAD_TREES)
def test_bad_trees_are_refused_naming_the_field(data, message):
    with pytest.raises(PolicyError) as error:
        parse_quota_file(data)
    assert str(error.value).startswith(message)


def chain(levels: int) -> dict:
    """A tree of ``levels`` cohorts one under the other, top first, with one quota at the bottom."""
    cohorts = [{"name": f"c{level}", "parent": f"c{level - 1}" if level else None} for level in range(levels)]
    return with_cohorts(cohorts, {"name": "a", "capacity": 4, "cohort": f"c{levels - 1}"})


def test_a_tree_as_deep_as_the_bound_is_accepted():
    (queue,) = parse_quota_file(chain(MAX_COHORT_DEPTH)).queues
    assert len(queue.cohorts) == MAX_COHORT_DEPTH


@pytest.mark.parametrize("levels", [MAX_COHORT_DEPTH + 1, 10_000])
def test_a_tree_deeper_than_the_bound_is_refused_at_its_first_cohort_too_deep(levels):
    # Ten thousand levels took minutes (a walk per cohort up the whole chain, each step a search of
    # the walk so far); the walk now stops at a cohort already measured.
    with pytest.raises(PolicyError) as error:
        parse_quota_file(chain(levels))
    assert str(error.value) == (
        f"queues[0].cohorts[{MAX_COHORT_DEPTH}].parent: cohort 'c{MAX_COHORT_DEPTH}' is {MAX_COHORT_DEPTH + 1} "
        f"levels deep, beyond the bound of {MAX_COHORT_DEPTH} levels of cohorts"
    )


def test_a_deep_tree_given_bottom_first_is_refused_at_its_deepest_cohort():
    data = chain(10_000)
    data["queues"][0]["cohorts"].reverse()
    with pytest.raises(PolicyError, match=r"^queues\[0\]\.cohorts\[0\]\.parent: cohort 'c9999' is 10000 levels deep"):
        parse_quota_file(data)


def test_a_cycle_of_ten_thousand_cohorts_is_named_at_its_first_cohort():
    data = chain(10_000)
    data["queues"][0]["cohorts"][0]["parent"] = "c9999"
    with pytest.raises(PolicyError, match=r"^queues\[0\]\.cohorts\[0\]\.parent: cycle: c0 -> c9999 -> c9998 -> "):
        parse_quota_file(data)
