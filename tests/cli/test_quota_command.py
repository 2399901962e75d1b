"""``airflow quota`` as a user runs it, before the set-up is complete: an error, not a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "quotas.yaml"


def test_status_without_the_quota_tables_says_to_run_db_migrate(tmp_path):
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path),
        "AIRFLOW__QUOTA__QUOTA_FILE": str(EXAMPLE),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    airflow = Path(sys.executable).with_name("airflow")
    result = subprocess.run([str(airflow), "quota", "status"], env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1
    assert "Error: cannot read the quota tables" in result.stderr and "airflow db migrate" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_set_priority_refuses_a_priority_beyond_32_bits_as_the_rest_api_does(tmp_path):
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__QUOTA__QUOTA_FILE": str(EXAMPLE),
           "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}
    airflow = Path(sys.executable).with_name("airflow")
    result = subprocess.run([str(airflow), "quota", "set-priority", "d", "r", "t", "2147483648"],
                            env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 1
    assert "Error: priority: 2147483648 is not an integer from -2147483648 to 2147483647" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_status_of_a_file_with_cohorts_lists_each_cohort_above_its_subtree():
    from airflow_quota_provider.cli.quota_command import as_tree
    from airflow_quota_provider.policy import CohortUsage, load_quota_file
    from airflow_quota_provider.usage import CohortRow

    quota_file = load_quota_file(EXAMPLE.with_name("cohort-quotas.yaml"))
    (queue,) = quota_file.queues
    quotas = [{"queue": queue.name, "quota": q.name, "sharing": q.sharing, "capacity": q.capacity} for q in queue.quotas]
    cohorts = [CohortRow(queue, c, CohortUsage(c.parent, 0, 0, 0, 0)) for c in queue.cohorts]
    table = as_tree(quota_file, quotas, cohorts, indent=True)
    assert [(row["quota"], row["cohort"], row["sharing"]) for row in table] == [
        ("ml", None, "cohort"),
        ("  research", "ml", "cohort"),
        ("    vision", "research", "lend_and_borrow"),
        ("    language", "research", "lend_and_borrow"),
        ("  training", "ml", "cohort"),
        ("    batch-train", "training", "lend_and_borrow"),
        ("web", None, "cohort"),
        ("  serving", "web", "lend"),
        ("  analytics", "web", "lend_and_borrow"),
    ]
    assert [row["quota"] for row in as_tree(quota_file, quotas, cohorts, indent=False)][:3] == ["ml", "research", "vision"]
