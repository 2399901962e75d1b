"""``airflow quota apply/status/set-priority --backend aws-batch`` bodies, parsed with argparse, on the fake."""

from __future__ import annotations

import argparse
import json

import pytest

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow_quota_provider.cli import aws_command
from airflow_quota_provider.operators.batch_training import SageMakerBatchTrainingOperator

QUOTAS = """
queues:
  - name: gpu-fleet
    capacity: 16
    capacity_unit: ml.p4d.24xlarge
    quotas:
      - name: team-a
        capacity: 8
        borrow_limit: 4
      - name: team-b
        capacity: 8
        sharing: reserve
"""


def parse(args: tuple, argv: list[str]) -> argparse.Namespace:
    return aws_command.add_arguments(argparse.ArgumentParser(), args).parse_args(argv)


@pytest.fixture
def quota_yaml(tmp_path):
    path = tmp_path / "quotas.yaml"
    path.write_text(QUOTAS)
    return str(path)


def apply(argv):
    apply_to(JOB_QUEUE, *argv)


def apply_to(job_queue, *argv):
    aws_command.apply(parse(aws_command.APPLY_ARGS, ["--backend", "aws-batch", "--job-queue", job_queue, *argv]))


def test_dry_run_shows_the_plan_and_changes_nothing(aws_fake, quota_yaml, capsys):  # noqa: F811
    apply(["--dry-run", quota_yaml])

    out = capsys.readouterr().out
    assert "create  team-a (capacity 8 ml.p4d.24xlarge; LEND_AND_BORROW borrowLimit 50%" in out
    assert "Dry run: nothing changed." in out
    assert aws_fake.shares == {}


def test_apply_then_apply_again_changes_nothing(aws_fake, quota_yaml, capsys):  # noqa: F811
    apply([quota_yaml])
    assert "Applied 2 change(s) to job queue gpu-fleet." in capsys.readouterr().out
    writes = len(aws_fake.calls_of("CreateQuotaShare"))

    apply([quota_yaml])

    out = capsys.readouterr().out
    assert "nothing to change" in out and "ok      team-a" in out
    assert len(aws_fake.calls_of("CreateQuotaShare")) == writes == 2


def test_apply_json_output(aws_fake, quota_yaml, capsys):  # noqa: F811
    apply(["--output", "json", quota_yaml])
    out = json.loads(capsys.readouterr().out)
    assert [c["action"] for c in out["changes"]] == ["create", "create"]
    assert (out["dry_run"], out["applied"]) == (False, 2)


def test_what_aws_cannot_express_exits_with_the_field(aws_fake, tmp_path):  # noqa: F811
    path = tmp_path / "q.yaml"
    path.write_text(QUOTAS.replace("borrow_limit: 4", "borrow_limit: 3"))
    with pytest.raises(SystemExit, match=r"^Error: queues\[0\].quotas\[0\].borrow_limit: 3 is 37.5%"):
        apply([str(path)])
    assert aws_fake.calls_of("CreateQuotaShare") == []


def test_bad_file_and_bad_queue_exit_without_traceback(aws_fake, tmp_path, quota_yaml, capsys):  # noqa: F811
    path = tmp_path / "bad.yaml"
    path.write_text(QUOTAS.replace("sharing: reserve", "sharing: hoard"))
    with pytest.raises(SystemExit, match=r"sharing: 'hoard' is not one of reserve, lend, lend_and_borrow"):
        apply([str(path)])
    with pytest.raises(SystemExit, match=r"^Error: --queue: 'other' is not one of gpu-fleet$"):
        apply(["--queue", "other", quota_yaml])
    with pytest.raises(SystemExit, match=r"^Error: job queue 'missing': not found in AWS Batch$"):
        apply_to("missing", quota_yaml)
    with pytest.raises(SystemExit, match=r"^Error: --backend: apply needs aws-batch"):
        aws_command.apply(parse(aws_command.APPLY_ARGS, ["--job-queue", JOB_QUEUE, quota_yaml]))
    with pytest.raises(SystemExit):
        parse(aws_command.APPLY_ARGS, ["--backend", "gcp", quota_yaml])
    assert "argument --backend: invalid choice: 'gcp'" in capsys.readouterr().err


def test_status_shows_per_share_usage(aws_fake, quota_yaml, capsys):  # noqa: F811
    apply([quota_yaml])
    aws_fake.default_script = []
    hook = aws_command._hook(parse(aws_command.STATUS_ARGS, ["--job-queue", JOB_QUEUE]))
    request = {"TrainingJobName": "t", "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 10}}
    job = hook.submit_service_job(job_name="big", job_queue=JOB_QUEUE, training_job_request=request,
                                  quota_share_name="team-a")["jobId"]
    aws_fake.start(job)
    capsys.readouterr()

    aws_command.status(parse(aws_command.STATUS_ARGS, ["--backend", "aws-batch", "--job-queue", JOB_QUEUE]))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "AWS Batch job queue gpu-fleet"
    assert lines[1].split() == aws_command.STATUS_COLUMNS
    assert lines[2].split() == ["team-a", "ENABLED", "LEND_AND_BORROW", "borrowLimit", "50%", "8",
                                "ml.p4d.24xlarge", "10", "2", "1", "0"]

    aws_command.status(parse(aws_command.STATUS_ARGS, ["--job-queue", JOB_QUEUE, "-o", "json"]))
    rows = json.loads(capsys.readouterr().out)["quota_shares"]
    assert {r["quota_share"]: r["in_use"] for r in rows} == {"team-a": 10.0, "team-b": 0.0}


def test_set_priority_finds_the_job_of_a_task_instance(aws_fake, quota_yaml, capsys):  # noqa: F811
    from tests.operators.test_batch_training import REQUEST, RecordingTI

    apply([quota_yaml])
    aws_fake.default_script = ["RUNNING", "SUCCEEDED"]
    ti = RecordingTI()
    job_id = SageMakerBatchTrainingOperator(
        task_id=ti.task_id, job_queue=JOB_QUEUE, training_job_request=REQUEST, quota_share_name="team-a",
        priority=10, waiter_delay=0,
    ).execute({"ti": ti})
    aws_fake.jobs[job_id].status = "RUNNABLE"  # still waiting

    aws_command.set_priority(parse(aws_command.SET_PRIORITY_ARGS, [
        "--backend", "aws-batch", "--job-queue", JOB_QUEUE, ti.dag_id, ti.run_id, ti.task_id, "900"]))

    assert aws_fake.jobs[job_id].priority == 900
    assert f"Service job {job_id}: schedulingPriority 900" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"^Error: priority: 10000 is not an integer between 0 and 9999"):
        aws_command.set_priority(parse(aws_command.SET_PRIORITY_ARGS, [
            "--job-queue", JOB_QUEUE, "--job-id", job_id, "d", "r", "t", "10000"]))
    with pytest.raises(SystemExit, match=r"^Error: no service job of d / r / t \(map index -1\)"):
        aws_command.set_priority(parse(aws_command.SET_PRIORITY_ARGS, ["--job-queue", JOB_QUEUE, "d", "r", "t", "5"]))
