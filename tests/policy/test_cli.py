"""The decision-file CLI as a user runs it: a real ``python -m airflow_quota_provider.policy``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from airflow_quota_provider.policy.config import MAX_COHORT_DEPTH
from tests.policy.test_config import chain

EXAMPLE = Path(__file__).parents[2] / "examples" / "quotas.yaml"

DESIGN_EXAMPLE = {
    "now": 1000.0,
    "capacity": 24,
    "quotas": [
        {"name": "team-a", "capacity": 8, "sharing": "lend_and_borrow", "borrow_limit": None, "lend_limit": None, "weight": 1,
         "preemption": {"within_quota": "lower_priority", "reclaim": "any", "borrow_within": None}}
    ],
    "running": [{"id": "j1", "quota": "team-a", "gpus": 2, "priority": 10, "started_at": 900.0, "submitted_at": 850.0}],
    "pending": [{"id": "j2", "quota": "team-a", "gpus": 4, "priority": 50, "submitted_at": 990.0}],
}


def policy(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "airflow_quota_provider.policy", *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def test_decide_prints_the_decision_of_the_design_example(tmp_path):
    path = tmp_path / "state.json"
    path.write_text(json.dumps(DESIGN_EXAMPLE))
    result = policy("decide", str(path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"admit": ["j2"], "preempt": [], "pending": [], "reject": []}


def test_decide_reads_stdin_and_reports_preemptions_and_reasons():
    state = dict(DESIGN_EXAMPLE, capacity=8, running=[dict(DESIGN_EXAMPLE["running"][0], gpus=8)])
    result = policy("decide", "-", stdin=json.dumps(state))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "admit": [],
        "preempt": [{"id": "j1", "for": "j2", "reason": "within_quota", "quota": "team-a", "fail": False}],
        "pending": [{"id": "j2", "position": 1, "reason": "waiting for preempted jobs to stop: j1"}],
        "reject": [],
    }


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"capacity": -3}, "capacity: -3 is below the minimum 1", id="bad queue capacity"),
        pytest.param({"surprise": True}, "surprise: unknown field", id="unknown top-level field"),
        pytest.param({"quotas": [{"name": "team-a", "capacity": 8, "sharing": "borrow"}]},
                     "quotas[0].sharing: 'borrow' is not one of reserve, lend, lend_and_borrow", id="bad sharing"),
        pytest.param({"pending": [dict(DESIGN_EXAMPLE["pending"][0], quota="team-z")]},
                     "pending[0].quota: 'team-z' is not one of team-a", id="unknown quota"),
        pytest.param({"running": [dict(DESIGN_EXAMPLE["running"][0], gpus=0)]},
                     "running[0].gpus: 0 is below the minimum 1", id="zero GPUs"),
        pytest.param({"pending": [dict(DESIGN_EXAMPLE["pending"][0], id="j1")]},
                     "pending[0].id: duplicate job id 'j1' (also at running[0].id)", id="duplicate ids"),
        pytest.param({"cohorts": [{"name": "ml", "parent": "org"}]},
                     "cohorts[0].parent: 'org', the parent of cohort 'ml', is not one of ml", id="unknown parent cohort"),
        pytest.param({"cohorts": chain(10_000)["queues"][0]["cohorts"],
                      "quotas": [dict(DESIGN_EXAMPLE["quotas"][0], cohort="c9999")]},
                     f"cohorts[{MAX_COHORT_DEPTH}].parent: cohort 'c{MAX_COHORT_DEPTH}' is {MAX_COHORT_DEPTH + 1} levels deep, "
                     f"beyond the bound of {MAX_COHORT_DEPTH} levels of cohorts", id="cohorts too deep"),
    ],
)
def test_decide_rejects_bad_input_with_exit_2_naming_the_field(change, message):
    result = policy("decide", "-", stdin=json.dumps(dict(DESIGN_EXAMPLE, **change)))
    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_decide_with_cohorts_reclaims_across_them():
    state = {
        "now": 1000.0,
        "capacity": 8,
        "cohorts": [{"name": "ml", "parent": None, "capacity": 8, "borrow_limit": None, "lend_limit": None}],
        "quotas": [{"name": "t1", "capacity": 0, "cohort": "ml"}, {"name": "w", "capacity": 0}],
        "running": [{"id": "w1", "quota": "w", "gpus": 8, "priority": 90, "started_at": 900.0, "submitted_at": 850.0}],
        "pending": [{"id": "t1a", "quota": "t1", "gpus": 4, "priority": 1, "submitted_at": 990.0}],
    }
    result = policy("decide", "-", stdin=json.dumps(state))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["preempt"] == [{"id": "w1", "for": "t1a", "reason": "reclaim", "quota": "w", "fail": False}]


def test_validate_prints_the_tree_of_cohorts():
    result = policy("validate", str(EXAMPLE.with_name("cohort-quotas.yaml")))
    assert result.returncode == 0, result.stderr
    assert "4 in the common pool" in result.stdout
    assert "  cohort ml: capacity 8\n    cohort research: capacity 8\n      vision: capacity 4" in result.stdout


def test_validate_prints_the_deepest_tree_allowed(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text(yaml.safe_dump(chain(MAX_COHORT_DEPTH)))
    result = policy("validate", str(path))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[1:-1] == [
        *(f"{'  ' * (level + 1)}cohort c{level}: capacity 0" for level in range(MAX_COHORT_DEPTH)),
        f"{'  ' * (MAX_COHORT_DEPTH + 1)}a: capacity 4, lend_and_borrow",
    ]


def test_validate_refuses_ten_thousand_levels_of_cohorts_with_exit_2(tmp_path):
    # It was a RecursionError traceback from the printer, after minutes of validation.
    path = tmp_path / "quotas.yaml"
    path.write_text(yaml.safe_dump(chain(10_000)))
    result = policy("validate", str(path))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (
        f"error: queues[0].cohorts[{MAX_COHORT_DEPTH}].parent: cohort 'c{MAX_COHORT_DEPTH}' is {MAX_COHORT_DEPTH + 1} "
        f"levels deep, beyond the bound of {MAX_COHORT_DEPTH} levels of cohorts\n"
    )


def test_decide_rejects_invalid_json():
    result = policy("decide", "-", stdin="{not json")
    assert result.returncode == 2 and "-: not valid JSON" in result.stderr


def test_validate_accepts_the_example_quota_file():
    result = policy("validate", str(EXAMPLE))
    assert result.returncode == 0, result.stderr
    assert "job queue gpu-fleet: 8 GPUs, 3 quotas, 0 in the common pool" in result.stdout
    assert result.stdout.strip().endswith("ok")


def test_validate_rejects_a_bad_quota_file_naming_the_field(tmp_path):
    bad = tmp_path / "quotas.yaml"
    bad.write_text(EXAMPLE.read_text().replace("sharing: reserve", "sharing: hoard"))
    result = policy("validate", str(bad))
    assert result.returncode == 2
    assert "queues[0].quotas[2].sharing: 'hoard' is not one of reserve, lend, lend_and_borrow" in result.stderr


HOSTS_EXAMPLE = dict(
    DESIGN_EXAMPLE,
    hosts=[{"name": "gpu-1", "gpus": 4, "queue": "gpu-fleet"}, {"name": "gpu-2", "gpus": 8, "queue": "gpu-fleet"}],
    running=[dict(DESIGN_EXAMPLE["running"][0], host="gpu-2")],
)


def test_decide_with_hosts_says_where_each_admitted_job_starts():
    result = policy("decide", "-", stdin=json.dumps(HOSTS_EXAMPLE))
    assert result.returncode == 0, result.stderr
    # j2 (4 GPUs) fills gpu-1 exactly; gpu-2 would keep 2 of its 6 free GPUs.
    assert json.loads(result.stdout) == {"admit": [{"id": "j2", "host": "gpu-1"}], "preempt": [], "pending": [], "reject": []}


def test_decide_with_hosts_rejects_a_job_larger_than_the_largest_host():
    state = dict(HOSTS_EXAMPLE, pending=[dict(DESIGN_EXAMPLE["pending"][0], gpus=9)])
    result = policy("decide", "-", stdin=json.dumps(state))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["reject"] == [
        {"id": "j2", "reason": "asks for 9 GPUs; the largest host of this job queue has 8"}
    ]


def _running(**change):
    return [dict(HOSTS_EXAMPLE["running"][0], **change)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        pytest.param({"running": _running(host="gpu-9")}, "running[0].host: 'gpu-9' is not one of gpu-1, gpu-2",
                     id="a running job on an unknown host"),
        pytest.param({"running": [{k: v for k, v in _running()[0].items() if k != "host"}]}, "running[0].host: is required",
                     id="a running job without its host"),
        pytest.param({"running": _running(gpus=9)},
                     "running[0].host: host gpu-2 has 8 GPUs; its running jobs hold 9 with this one",
                     id="running jobs hold more than their host has"),
        pytest.param({"hosts": [{"name": "gpu-1", "gpus": 4}, {"name": "gpu-1", "gpus": 8}]},
                     "hosts[1].name: duplicate host name 'gpu-1' (also at hosts[0].name)", id="duplicate host names"),
        pytest.param({"hosts": [{"name": "gpu-1", "gpus": 16}, {"name": "gpu-2", "gpus": 16}]},
                     "hosts: host GPUs sum to 32, above the job queue's capacity 24", id="hosts above the capacity"),
        pytest.param({"hosts": [{"name": "gpu-2", "gpus": 0}]}, "hosts[0].gpus: 0 is below the minimum 1", id="a host without GPUs"),
        pytest.param({"hosts": [{"name": "gpu-2", "gpus": 8, "row": 3}]}, "hosts[0].row: unknown field",
                     id="unknown host field"),
        pytest.param({"hosts": [{"name": "gpu-2", "gpus": 8, "rack": 3}]},
                     "hosts[0].rack: expected a non-empty string, got 3 (int)", id="a rack label that is not a name"),
        pytest.param({"hosts": [{"name": "gpu-1", "gpus": 4, "queue": "a"}, {"name": "gpu-2", "gpus": 8, "queue": "b"}]},
                     "hosts[1].queue: 'b' is not one of a (a decision file is one job queue", id="hosts of two job queues"),
        pytest.param({"hosts": []}, "hosts: at least one host", id="an empty host list"),
        pytest.param({"hosts": None}, "running[0].host: only allowed when the decision file lists hosts",
                     id="a running job's host without hosts"),
        pytest.param({"pending": [dict(DESIGN_EXAMPLE["pending"][0], host="gpu-1")]}, "pending[0].host: unknown field",
                     id="a waiting job's host"),
    ],
)
def test_decide_rejects_bad_hosts_with_exit_2_naming_the_field(change, message):
    result = policy("decide", "-", stdin=json.dumps(dict(HOSTS_EXAMPLE, **change)))
    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert "Traceback" not in result.stderr
