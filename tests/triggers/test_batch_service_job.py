"""BatchServiceJobTrigger: its async run() for real against the local AWS Batch fake."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook
from airflow_quota_provider.triggers.batch_service_job import BatchServiceJobTrigger


@pytest.fixture
def job_id(aws_fake):  # noqa: F811
    aws_fake.add_job_queue(JOB_QUEUE, quota_share_policy=False)
    return BatchQuotaShareHook().submit_service_job(
        job_name="train", job_queue=JOB_QUEUE, training_job_request=json.dumps({"TrainingJobName": "t"})
    )["jobId"]


def run(trigger: BatchServiceJobTrigger) -> list:
    async def collect():
        return [event async for event in trigger.run()]

    return asyncio.run(collect())


def test_serializes_to_what_rebuilds_it():
    trigger = BatchServiceJobTrigger(job_id="j-1", waiter_delay=5, waiter_max_attempts=9, region_name="eu-west-1")
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_quota_provider.triggers.batch_service_job.BatchServiceJobTrigger"
    assert kwargs == {
        "job_id": "j-1",
        "waiter_delay": 5,
        "waiter_max_attempts": 9,
        "aws_conn_id": "aws_default",
        "region_name": "eu-west-1",
    }
    assert BatchServiceJobTrigger(**kwargs).serialize() == (classpath, kwargs)


def test_waits_through_a_preemption_until_succeeded(aws_fake, job_id):  # noqa: F811
    aws_fake.set_script(job_id, ["RUNNABLE", "RUNNING", "PREEMPT", "RUNNING", "SUCCEEDED"])

    events = run(BatchServiceJobTrigger(job_id=job_id, waiter_delay=0, waiter_max_attempts=10))

    assert [e.payload for e in events] == [{"status": "success", "job_id": job_id}]
    assert aws_fake.job(job_id).history == ["SUBMITTED", "RUNNABLE", "RUNNING", "RUNNABLE", "RUNNING", "SUCCEEDED"]
    assert len(aws_fake.calls_of("DescribeServiceJob")) == 5


def test_failed_job_gives_an_error_event_with_the_reason(aws_fake, job_id):  # noqa: F811
    aws_fake.set_script(job_id, ["RUNNING", "PREEMPT", ("FAILED", "Job preempted too often")])

    (event,) = run(BatchServiceJobTrigger(job_id=job_id, waiter_delay=0, waiter_max_attempts=10))

    assert event.payload["status"] == "error"
    assert event.payload["job_id"] == job_id
    assert "FAILED - preempted 1 times - Job preempted too often" in event.payload["message"]


def test_gives_up_after_max_attempts(aws_fake, job_id):  # noqa: F811
    (event,) = run(BatchServiceJobTrigger(job_id=job_id, waiter_delay=0, waiter_max_attempts=3))
    assert event.payload["status"] == "error"
    assert "max attempts reached" in event.payload["message"]
    assert len(aws_fake.calls_of("DescribeServiceJob")) == 3
