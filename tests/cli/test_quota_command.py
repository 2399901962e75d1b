"""``airflow quota`` as a user runs it, before the set-up is complete: an error, not a traceback."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


# ------------------------------------------------------------------------------------------- gangs

GANG = {"case": "gang", "quota": "team-a", "gpus": 4, "nodes": 2, "state": "running",
        "hosts": [["gpu-b", ["0", "1"]], ["gpu-a", ["2", "3"]]]}
ONE_HOST = {"case": "one_host", "quota": "team-a", "gpus": 1, "state": "running", "devices": ["7"]}


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    """The gang and a job on one host in a SQLite database that the commands' sessions read."""
    from contextlib import contextmanager

    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from airflow_quota_provider.cli import quota_command
    from airflow_quota_provider.models.base import quota_metadata
    from airflow_quota_provider.models.host import register_host
    from tests.plugins.seed import seed_into

    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        seed_into([GANG, ONE_HOST], session=session)
        for host in ("gpu-a", "gpu-b", "gpu-c"):
            register_host(host, queues=["gpu-fleet"], devices=["0", "1", "2", "3"], celery_name=None, session=session)
        session.commit()

    @contextmanager
    def create_session():
        with Session(engine) as session:
            yield session

    monkeypatch.setattr(quota_command, "create_session", create_session)
    return quota_command


def _args(**kwargs):
    import argparse

    return argparse.Namespace(verbose=False, all=False, map_index=-1, **kwargs)


def test_jobs_show_a_gangs_hosts_and_each_nodes_devices(seeded, capsys):
    seeded.jobs(_args(output="table"))
    table = capsys.readouterr().out
    (gang,) = [line for line in table.splitlines() if " gang " in line]
    assert "gpu-b,gpu-a (2 nodes)" in gang and "gpu-b:0,1 gpu-a:2,3" in gang
    (one,) = [line for line in table.splitlines() if " one_host " in line]
    assert " local " in one and "(1 nodes)" not in one

    seeded.jobs(_args(output="csv"))
    rows = {row["task_id"]: row for row in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert (rows["gang"]["nodes"], rows["gang"]["hosts"], rows["gang"]["devices"]) == (
        "2", "gpu-b,gpu-a (2 nodes)", "gpu-b:0,1 gpu-a:2,3")
    assert (rows["one_host"]["hosts"], rows["one_host"]["devices"]) == ("local", "7")

    seeded.jobs(_args(output="json"))
    gang = next(j for j in json.loads(capsys.readouterr().out) if j["task_id"] == "gang")
    assert (gang["nodes"], gang["hosts"], gang["devices"]) == (2, ["gpu-b", "gpu-a"], ["0", "1"])
    assert gang["placement"] == [{"host": "gpu-b", "devices": ["0", "1"]}, {"host": "gpu-a", "devices": ["2", "3"]}]


def test_explain_a_gang_names_its_hosts_and_gpus_per_node(seeded, capsys):
    seeded.explain(_args(output="table", dag_id="quota_cases", run_id="seeded", task_id="gang"))
    out = capsys.readouterr().out
    assert "4 GPUs (2 nodes x 2)" in out
    assert "  hosts gpu-b,gpu-a (2 nodes)\n" in out
    assert "  devices gpu-b:0,1 gpu-a:2,3\n" in out
    assert "node 1 of 2" in out  # its admitted event per host
    seeded.explain(_args(output="json", dag_id="quota_cases", run_id="seeded", task_id="gang"))
    info = json.loads(capsys.readouterr().out)
    assert [n["host"] for n in info["placement"]] == info["hosts"] == ["gpu-b", "gpu-a"]


def test_hosts_count_a_gang_and_its_gpus_on_each_of_its_hosts(seeded, capsys):
    seeded.hosts(_args(output="json"))
    hosts = {h["name"]: (h["jobs"], h["in_use"]) for h in json.loads(capsys.readouterr().out)}
    assert hosts == {"gpu-a": (1, 2), "gpu-b": (1, 2), "gpu-c": (0, 0)}
