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


def _commands(tmp_path, monkeypatch, quotas: str | None, jobs: list[dict], hosts: dict[str, tuple[str, str | None, int]]):
    """The commands over a SQLite database seeded with ``jobs`` and ``hosts`` (name -> queue, GPU type,
    GPUs), with ``quotas`` as the quota file (None: the one configured)."""
    from contextlib import contextmanager

    import yaml
    from sqlalchemy import create_engine
    from sqlalchemy.orm import Session

    from airflow_quota_provider.cli import quota_command
    from airflow_quota_provider.models.base import quota_metadata
    from airflow_quota_provider.models.host import register_host
    from airflow_quota_provider.policy import parse_quota_file
    from tests.plugins.seed import seed_into

    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        seed_into(jobs, session=session)
        for name, (queue, gpu_type, gpus) in hosts.items():
            register_host(name, queues=[queue], devices=[str(i) for i in range(gpus)], celery_name=None,
                          gpu_type=gpu_type, session=session)
        session.commit()

    @contextmanager
    def create_session():
        with Session(engine) as session:
            yield session

    monkeypatch.setattr(quota_command, "create_session", create_session)
    if quotas is not None:
        monkeypatch.setattr(quota_command, "_quota_file", lambda: parse_quota_file(yaml.safe_load(quotas)))
    return quota_command


@pytest.fixture
def seeded(tmp_path, monkeypatch):
    """The gang and a job on one host in a SQLite database that the commands' sessions read."""
    hosts = {host: ("gpu-fleet", None, 4) for host in ("gpu-a", "gpu-b", "gpu-c")}
    return _commands(tmp_path, monkeypatch, None, [GANG, ONE_HOST], hosts)


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


# ------------------------------------------------------------------------------------------- GPU types


TYPED_HOSTS = {"h100-a": ("mixed", "h100", 4), "a100-a": ("mixed", "a100", 8), "lab-a": ("lab", None, 2)}


def test_status_lists_each_gpu_type_of_a_typed_quota_under_it(tmp_path, monkeypatch, capsys):
    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    commands = _commands(tmp_path, monkeypatch, TYPED_QUOTAS, list(TYPED_JOBS), TYPED_HOSTS)
    commands.status(_args(output="csv"))
    figures = ("gpu_type", "capacity", "in_use", "borrowed", "lent", "free", "pending_jobs", "queue_gpus")
    rows = [(r["quota"], *(r[k] for k in figures)) for r in csv.DictReader(io.StringIO(capsys.readouterr().out))]
    assert rows == [
        ("team-a", "", "6", "3", "0", "0", "7", "0", "12"),
        ("team-a", "h100", "2", "3", "1", "0", "1", "", "4"),
        ("team-a", "a100", "4", "0", "0", "0", "6", "", "8"),
        ("team-b", "", "6", "2", "0", "0", "7", "1", "12"),
        ("team-b", "h100", "2", "0", "0", "1", "1", "", "4"),
        ("team-b", "a100", "4", "2", "0", "0", "6", "", "8"),
        ("team-lab", "", "2", "1", "0", "0", "1", "0", "2"),
    ]

    commands.status(_args(output="table"))
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["queue", "quota", "gpu_type", "sharing"]
    assert [line.split()[:3] for line in lines[:3]] == [["mixed", "team-a", "lend_and_borrow"], ["mixed", "team-a", "h100"],
                                                        ["mixed", "team-a", "a100"]]

    commands.status(_args(output="json"))
    quotas = {row["quota"]: row for row in json.loads(capsys.readouterr().out)}
    assert quotas["team-b"]["types"] == [
        {"gpu_type": "h100", "capacity": 2, "in_use": 0, "borrowed": 0, "lent": 1, "free": 1, "queue_gpus": 4},
        {"gpu_type": "a100", "capacity": 4, "in_use": 2, "borrowed": 0, "lent": 0, "free": 6, "queue_gpus": 8},
    ]
    assert "types" not in quotas["team-lab"]


def test_status_of_an_untyped_quota_file_has_no_gpu_type_column(tmp_path, monkeypatch, capsys):
    from tests.quota_api_support import BASELINE, QUOTAS

    commands = _commands(tmp_path, monkeypatch, QUOTAS, list(BASELINE), {})
    commands.status(_args(output="csv"))
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert list(rows[0]) == ["queue", "quota", "sharing", "capacity", "in_use", "borrowed", "lent", "free", "pending_jobs",
                             "pending_gpus"]
    assert [r["quota"] for r in rows] == ["team-a", "team-b", "team-lab"]
    commands.jobs(_args(output="csv"))
    assert "gpu_type" not in capsys.readouterr().out.splitlines()[0]


def test_jobs_show_the_gpu_types_asked_and_the_one_chosen_and_hosts_their_type(tmp_path, monkeypatch, capsys):
    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    commands = _commands(tmp_path, monkeypatch, TYPED_QUOTAS, list(TYPED_JOBS), TYPED_HOSTS)
    commands.jobs(_args(output="csv"))
    jobs = {r["task_id"]: (r["gpu_types"], r["gpu_type"]) for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert jobs == {"team_a_on_h100": ("", "h100"), "team_b_on_a100": ("", "a100"),
                    "team_b_waits_for_h100": ("h100", ""), "team_lab_running": ("", "")}

    commands.explain(_args(output="table", dag_id="quota_cases", run_id="seeded", task_id="team_b_waits_for_h100"))
    assert "  gpu type - (asked h100)\n" in capsys.readouterr().out

    commands.hosts(_args(output="csv"))
    hosts = {r["name"]: r["gpu_type"] for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert hosts == {"h100-a": "h100", "a100-a": "a100", "lab-a": ""}


def test_status_lists_each_gpu_type_of_a_typed_cohort_under_it(tmp_path, monkeypatch, capsys):
    import yaml

    from tests.test_usage import TYPED_JOBS, TYPED_QUOTAS

    data = yaml.safe_load(TYPED_QUOTAS)
    data["queues"][0]["cohorts"] = [{"name": "ml"}]
    data["queues"][0]["quotas"][0]["cohort"] = "ml"  # team-a
    commands = _commands(tmp_path, monkeypatch, yaml.safe_dump(data, sort_keys=False), list(TYPED_JOBS), {})
    commands.status(_args(output="csv"))
    rows = [(r["quota"], r["cohort"], r["gpu_type"], r["sharing"], r["capacity"], r["in_use"], r["borrowed"])
            for r in csv.DictReader(io.StringIO(capsys.readouterr().out))]
    assert rows[:6] == [
        ("team-b", "", "", "lend_and_borrow", "6", "2", "0"),
        ("team-b", "", "h100", "", "2", "0", "0"),
        ("team-b", "", "a100", "", "4", "2", "0"),
        ("ml", "", "", "cohort", "6", "3", "0"),
        ("ml", "", "h100", "", "2", "3", "1"),
        ("ml", "", "a100", "", "4", "0", "0"),
    ]
    assert rows[6:9] == [("  team-a", "ml", "", "lend_and_borrow", "6", "3", "0"),
                         ("  team-a", "ml", "h100", "", "2", "3", "1"), ("  team-a", "ml", "a100", "", "4", "0", "0")]
