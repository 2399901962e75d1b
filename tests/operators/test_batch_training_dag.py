"""The example DAG through Airflow itself (``dag.test()`` in a subprocess) against the AWS fake.

Try 1 submits the training job and dies before it sees it; Airflow retries the task; try 2 finds
the job by its task-instance key and defers on it; the trigger waits through a preemption; the job
succeeds. One job was submitted, and the preemption count is in XCom.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook
from airflow_quota_provider.policy import parse_quota_file

REPO = Path(__file__).resolve().parents[2]
DAG_FILE = REPO / "dags" / "aws_batch_training.py"
DRIVER = Path(__file__).with_name("aws_dag_driver.py")


def run_dag(dag_id: str, tmp_path: Path) -> dict:
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "airflow-home"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
        "AWS_BATCH_EXAMPLE_POLL_SECONDS": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [sys.executable, str(DRIVER), str(DAG_FILE), dag_id],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"driver failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return json.loads(lines[-1][len("RESULT "):]) | {"log": proc.stdout + proc.stderr}


def test_a_retried_task_does_not_submit_twice_through_airflow(aws_fake, tmp_path):  # noqa: F811
    queue = parse_quota_file({"queues": [{"name": JOB_QUEUE, "capacity": 8, "capacity_unit": "ml.p4d.24xlarge",
                                          "quotas": [{"name": "team-a", "capacity": 4, "borrow_limit": 2}]}]})
    hook = BatchQuotaShareHook()
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, queue.queues[0]))
    aws_fake.fail_next["DescribeServiceJob"] = "Rate exceeded"  # try 1 dies right after submitting
    aws_fake.default_script = ["RUNNABLE", "RUNNING", "PREEMPT", "RUNNING", "SUCCEEDED"]

    result = run_dag("aws_batch_training", tmp_path)

    assert result["state"] == "success", result["log"][-4000:]
    assert result["tasks"]["train"] == {"state": "success", "try_number": 2}
    assert len(aws_fake.calls_of("SubmitServiceJob")) == 1
    (job,) = aws_fake.jobs.values()
    assert job.history == ["SUBMITTED", "RUNNABLE", "RUNNING", "RUNNABLE", "RUNNING", "SUCCEEDED"]
    body = aws_fake.calls_of("SubmitServiceJob")[0]
    assert (body["quotaShareName"], body["schedulingPriority"]) == ("team-a", 50)
    assert body["preemptionConfiguration"] == {"preemptionRetriesBeforeTermination": 3}
    assert json.loads(body["serviceRequestPayload"])["TrainingJobName"].startswith("llama-ft-")
    assert result["xcom"]["train.preempted_attempt_count"] == 1
    assert result["xcom"]["train.return_value"] == job.job_id
    log = result["log"]
    assert "was submitted by an earlier try" in log
    assert "not finished yet: RUNNABLE - preempted 1 times" in log  # the trigger's poll, after the preemption
    assert "was preempted (preemption 1 of at most 3 retried)" in log


def test_the_example_file_defines_both_dags_with_the_sdk_names():
    import importlib.util

    from airflow_quota_provider.operators.batch_training import (
        SageMakerBatchTrainingOperator,
        UpdateServiceJobPriorityOperator,
    )

    spec = importlib.util.spec_from_file_location("aws_batch_training_example", DAG_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)

    train = module.training_dag.get_task("train")
    assert isinstance(train, SageMakerBatchTrainingOperator)
    assert (train.quota_share_name, train.priority) == ("{{ params.quota_share }}", "{{ params.priority }}")
    assert train.preemption_retries_before_termination == 3
    assert train.deferrable is True and train.retries == 1
    assert isinstance(module.priority_dag.get_task("set_priority"), UpdateServiceJobPriorityOperator)
