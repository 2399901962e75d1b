"""``airflow quota`` parses as documented: local commands, --backend aws-batch, apply and simulate."""

from __future__ import annotations

import argparse

import pytest

from airflow.cli.cli_parser import _add_command
from airflow_quota_provider.cli.definition import get_quota_cli_commands


@pytest.fixture(scope="module")
def parser():
    root = argparse.ArgumentParser(prog="airflow")
    sub = root.add_subparsers(dest="subcommand")
    for command in get_quota_cli_commands():
        _add_command(sub, command)
    return root


def test_set_priority_takes_the_task_instance_and_map_index(parser):
    args = parser.parse_args(["quota", "set-priority", "dag", "run", "task", "70", "--map-index", "3"])
    assert (args.dag_id, args.run_id, args.task_id, args.priority, args.map_index) == ("dag", "run", "task", 70, 3)
    assert args.backend == "local" and args.func.__name__ == "set_priority"


def test_jobs_and_status_default_to_a_table(parser):
    assert parser.parse_args(["quota", "jobs"]).output == "table"
    assert parser.parse_args(["quota", "jobs", "--output", "json", "--all"]).all is True
    assert parser.parse_args(["quota", "status"]).backend == "local"


def test_explain_names_the_task_instance(parser):
    args = parser.parse_args(["quota", "explain", "dag", "run", "task"])
    assert (args.dag_id, args.run_id, args.task_id, args.map_index) == ("dag", "run", "task", -1)


def test_aws_backend_and_apply_are_wired(parser):
    status = parser.parse_args(["quota", "status", "--backend", "aws-batch", "--job-queue", "gpu-queue"])
    assert (status.backend, status.job_queue) == ("aws-batch", "gpu-queue")
    apply = parser.parse_args(["quota", "apply", "--backend", "aws-batch", "--job-queue", "q", "--dry-run", "q.yaml"])
    assert (apply.quota_file, apply.dry_run, apply.func.__name__) == ("q.yaml", True, "apply")


def test_an_unknown_backend_is_refused_naming_the_choices(parser, capsys):
    with pytest.raises(SystemExit):
        parser.parse_args(["quota", "status", "--backend", "gcp"])
    assert "choose from 'local', 'aws-batch'" in capsys.readouterr().err


def test_simulate_is_a_quota_subcommand(parser):
    names = {c.name for c in get_quota_cli_commands()[0].subcommands}
    assert names == {"status", "jobs", "hosts", "worker", "set-priority", "explain", "apply", "usage", "db-clean",
                     "simulate"}
