"""BatchServiceJobSensor against the local AWS Batch fake: one test per outcome of poke."""

from __future__ import annotations

import json

import pytest

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow.sdk.exceptions import TaskDeferred
from airflow.providers.common.compat.sdk import AirflowException

from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook
from airflow_quota_provider.sensors.batch_service_job import BatchServiceJobSensor
from airflow_quota_provider.triggers.batch_service_job import BatchServiceJobTrigger


@pytest.fixture
def job_id(aws_fake):  # noqa: F811
    aws_fake.add_job_queue(JOB_QUEUE, quota_share_policy=False)  # a FIFO queue: no quota share needed
    return BatchQuotaShareHook().submit_service_job(
        job_name="train", job_queue=JOB_QUEUE, training_job_request=json.dumps({"TrainingJobName": "t"})
    )["jobId"]


def sensor(job_id: str, **kwargs) -> BatchServiceJobSensor:
    return BatchServiceJobSensor(task_id="wait", job_id=job_id, **kwargs)


def test_poke_true_when_succeeded(aws_fake, job_id):  # noqa: F811
    aws_fake.start(job_id)
    aws_fake.succeed(job_id)
    assert sensor(job_id).poke({}) is True


@pytest.mark.parametrize("status", ["SUBMITTED", "RUNNABLE", "RUNNING"])
def test_poke_false_while_waiting_or_running(aws_fake, job_id, status):  # noqa: F811
    if status != "SUBMITTED":
        aws_fake.make_runnable(job_id)
    if status == "RUNNING":
        aws_fake.start(job_id)
    assert sensor(job_id).poke({}) is False


def test_poke_false_after_a_preemption_requeued_the_job(aws_fake, job_id):  # noqa: F811
    aws_fake.start(job_id)
    aws_fake.preempt(job_id)
    assert aws_fake.job(job_id).status == "RUNNABLE"
    assert sensor(job_id).poke({}) is False


def test_poke_raises_naming_the_status_and_reason_when_failed(aws_fake, job_id):  # noqa: F811
    aws_fake.start(job_id)
    aws_fake.fail(job_id, "AlgorithmError: loss is NaN")
    with pytest.raises(AirflowException, match=r"is FAILED: AlgorithmError: loss is NaN \(preempted 0 time\(s\)\)"):
        sensor(job_id).poke({})


def test_deferrable_sensor_defers_to_the_trigger(job_id):  # noqa: F811
    with pytest.raises(TaskDeferred) as deferred:
        sensor(job_id, deferrable=True, poke_interval=7, max_retries=3).execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, BatchServiceJobTrigger)
    assert (trigger.waiter_delay, trigger.attempts) == (7, 3)
    with pytest.raises(AirflowException, match="max attempts"):
        sensor(job_id).execute_complete({}, {"status": "error", "message": "Waiter error: max attempts reached"})
