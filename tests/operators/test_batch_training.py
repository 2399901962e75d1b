"""SageMakerBatchTrainingOperator and UpdateServiceJobPriorityOperator against the local AWS Batch fake.

The operators call ``execute`` with a context whose ``ti`` records XCom pushes; everything below the
operator (hook, boto3, HTTP, the fake's state machine) is real. The end-to-end retry through Airflow
itself is in ``test_batch_training_dag.py``.
"""

from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest
from botocore.exceptions import ClientError

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: F401  (fixture)

from airflow.sdk.exceptions import TaskDeferred
from airflow.providers.common.compat.sdk import AirflowException

from airflow_quota_provider.hooks.batch_quota import TASK_INSTANCE_TAG, BatchQuotaShareHook
from airflow_quota_provider.operators.batch_training import (
    XCOM_JOB_ID,
    XCOM_PREEMPTIONS,
    SageMakerBatchTrainingOperator,
    UpdateServiceJobPriorityOperator,
    task_instance_key,
)
from airflow_quota_provider.policy import parse_quota_file
from airflow_quota_provider.protocol import MAX_NODES
from airflow_quota_provider.triggers.batch_service_job import BatchServiceJobTrigger

UNIT = "ml.p4d.24xlarge"
REQUEST = {
    "TrainingJobName": "llama-ft",
    "AlgorithmSpecification": {"TrainingImage": "example/train:1", "TrainingInputMode": "File"},
    "ResourceConfig": {"InstanceType": UNIT, "InstanceCount": 1, "VolumeSizeInGB": 50},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
}
#: The request without an InstanceCount of its own, for the operator's ``nodes`` to set.
UNSIZED = {**REQUEST, "ResourceConfig": {"InstanceType": UNIT, "VolumeSizeInGB": 50}}


# Airflow 3 logs through structlog to stdout: the tests read task logs with capsys.


@dataclass
class RecordingTI:
    """The task-instance fields the operator reads, and the XComs it pushes."""

    dag_id: str = "train_dag"
    run_id: str = "manual__2026-12-01T00:00:00+00:00"
    task_id: str = "train"
    map_index: int = -1
    try_number: int = 1
    xcom: dict = field(default_factory=dict)

    def xcom_push(self, key, value):
        self.xcom[key] = value


@pytest.fixture
def queue(aws_fake):  # noqa: F811
    quotas = parse_quota_file(
        {
            "queues": [
                {
                    "name": JOB_QUEUE,
                    "capacity": 4,
                    "capacity_unit": UNIT,
                    "quotas": [{"name": "team-a", "capacity": 2}, {"name": "team-b", "capacity": 2}],
                }
            ]
        }
    ).queues[0]
    hook = BatchQuotaShareHook()
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quotas))
    return aws_fake


def operator(**kwargs) -> SageMakerBatchTrainingOperator:
    args = dict(
        task_id="train",
        job_queue=JOB_QUEUE,
        training_job_request=REQUEST,
        quota_share_name="team-a",
        priority=50,
        waiter_delay=0,
        waiter_max_attempts=20,
        deferrable=False,
    )
    args.update(kwargs)
    return SageMakerBatchTrainingOperator(**args)


def only_job(fake):
    assert len(fake.jobs) == 1, f"expected one submitted job, got {len(fake.jobs)}"
    return next(iter(fake.jobs.values()))


def test_submit_runnable_running_preempted_runnable_succeeded(queue, capsys):
    queue.default_script = ["RUNNABLE", "RUNNING", "PREEMPT", "RUNNING", "SUCCEEDED"]
    ti = RecordingTI()

    job_id = operator().execute({"ti": ti})

    job = only_job(queue)
    assert job_id == job.job_id
    assert job.history == ["SUBMITTED", "RUNNABLE", "RUNNING", "RUNNABLE", "RUNNING", "SUCCEEDED"]
    assert ti.xcom == {XCOM_JOB_ID: job_id, XCOM_PREEMPTIONS: 1}
    assert f"Service job {job_id} was preempted (preemption 1): Preempted by a higher priority job" in capsys.readouterr().out


def test_submitted_request_carries_quota_priority_and_preemption_settings(queue):
    queue.default_script = ["RUNNING", "SUCCEEDED"]
    ti = RecordingTI()

    operator(
        preemption_config={"preemptionRetriesBeforeTermination": 3},
        retry_strategy={"attempts": 2},
        timeout_config={"attemptDurationSeconds": 7200},
        tags={"team": "a"},
    ).execute({"ti": ti})

    body = queue.calls_of("SubmitServiceJob")[0]
    assert json.loads(body["serviceRequestPayload"]) == REQUEST
    assert body["quotaShareName"] == "team-a"
    assert body["schedulingPriority"] == 50
    assert body["preemptionConfiguration"] == {"preemptionRetriesBeforeTermination": 3}
    assert body["retryStrategy"] == {"attempts": 2}
    assert body["timeoutConfig"] == {"attemptDurationSeconds": 7200}
    key = task_instance_key(ti)
    assert body["tags"] == {"team": "a", TASK_INSTANCE_TAG: key}
    assert body["clientToken"] == f"airflow-{key}"
    assert body["jobName"] == f"train_dag-train-{key[:8]}"


def test_preemption_limit_fails_the_task_with_the_status_reason(queue):
    queue.default_script = ["RUNNABLE", "RUNNING", "PREEMPT", "RUNNING", "PREEMPT"]
    ti = RecordingTI()

    with pytest.raises(AirflowException) as error:
        operator(preemption_config={"preemptionRetriesBeforeTermination": 1}).execute({"ti": ti})

    job = only_job(queue)
    assert job.history[-1] == "FAILED"
    assert "preemptionRetriesBeforeTermination (1) exhausted" in str(error.value)
    assert str(error.value).endswith("(preempted 2 time(s))")
    assert ti.xcom[XCOM_PREEMPTIONS] == 2


def test_a_failed_training_job_fails_the_task_with_its_reason(queue):
    queue.default_script = ["RUNNING", ("FAILED", "AlgorithmError: CUDA out of memory")]

    with pytest.raises(AirflowException, match=r"FAILED: AlgorithmError: CUDA out of memory \(preempted 0"):
        operator().execute({"ti": RecordingTI()})


def test_a_retried_task_reattaches_instead_of_submitting_twice(queue, capsys):
    # Try 1 submits, then dies before it sees the job (a non-retriable error on its first look).
    queue.fail_next["DescribeServiceJob"] = "Rate exceeded for this account"
    with pytest.raises(Exception, match="Rate exceeded"):
        operator().execute({"ti": RecordingTI(try_number=1)})
    job = only_job(queue)
    job.script = ["RUNNABLE", "RUNNING", "SUCCEEDED"]

    ti = RecordingTI(try_number=2)
    job_id = operator().execute({"ti": ti})

    assert job_id == job.job_id
    assert len(queue.calls_of("SubmitServiceJob")) == 1
    assert only_job(queue).status == "SUCCEEDED"
    assert "was submitted by an earlier try and is RUNNABLE; waiting for it, not submitting again" in capsys.readouterr().out


def test_a_repeated_client_token_attaches_to_the_job_it_created(queue):
    queue.fail_next["DescribeServiceJob"] = "Rate exceeded for this account"
    with pytest.raises(Exception, match="Rate exceeded"):
        operator().execute({"ti": RecordingTI(try_number=1)})
    job = only_job(queue)
    job.script = ["RUNNING", "SUCCEEDED"]
    queue.list_lag[job.job_id] = 1  # the retry's look-up does not list the job yet

    assert operator().execute({"ti": RecordingTI(try_number=2)}) == job.job_id

    submits = queue.calls_of("SubmitServiceJob")
    assert len(submits) == 2 and submits[0]["clientToken"] == submits[1]["clientToken"]
    assert len(queue.jobs) == 1  # AWS rejected the repeat; the operator attached to the first job


def test_a_retry_after_a_failed_job_submits_a_new_one_once(queue):
    queue.default_script = ["RUNNING", ("FAILED", "AlgorithmError: bad input")]
    with pytest.raises(AirflowException, match="bad input"):
        operator().execute({"ti": RecordingTI(try_number=1)})
    queue.default_script = ["RUNNING", "SUCCEEDED"]

    second = operator().execute({"ti": RecordingTI(try_number=2)})
    third = operator().execute({"ti": RecordingTI(try_number=3)})

    assert second == third
    tokens = [body["clientToken"] for body in queue.calls_of("SubmitServiceJob")]
    assert len(tokens) == 2 and tokens[0] != tokens[1]


def test_each_mapped_task_instance_submits_its_own_job(queue):
    queue.default_script = ["RUNNING", "SUCCEEDED"]
    ids = {operator().execute({"ti": RecordingTI(map_index=i)}) for i in range(2)}
    assert len(ids) == 2 and len(queue.jobs) == 2


def test_on_kill_terminates_the_job(queue):
    queue.default_script = ["RUNNABLE", "RUNNING"]  # then it keeps running
    op = operator(waiter_delay=0.02, waiter_max_attempts=5000)
    outcome = {}

    def run():
        try:
            op.execute({"ti": RecordingTI()})
        except AirflowException as error:
            outcome["error"] = str(error)

    worker = threading.Thread(target=run)
    worker.start()
    for _ in range(500):
        if queue.jobs and next(iter(queue.jobs.values())).status == "RUNNING":
            break
        time.sleep(0.01)
    op.on_kill()
    worker.join(timeout=30)

    job = only_job(queue)
    assert (job.status, job.is_terminated, job.status_reason) == ("FAILED", True, "Airflow task was killed")
    assert queue.calls_of("TerminateServiceJob") == [{"jobId": job.job_id, "reason": "Airflow task was killed"}]
    assert "FAILED: Airflow task was killed" in outcome["error"]


def test_deferrable_path_through_the_trigger(queue, capsys):
    queue.default_script = ["RUNNABLE", "RUNNING", "PREEMPT", "RUNNING", "SUCCEEDED"]
    ti = RecordingTI()
    op = operator(deferrable=True, waiter_delay=0, waiter_max_attempts=10)

    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    trigger = deferred.value.trigger
    assert isinstance(trigger, BatchServiceJobTrigger)
    assert deferred.value.method_name == "execute_complete"

    classpath, kwargs = trigger.serialize()
    revived = BatchServiceJobTrigger(**kwargs)  # what the triggerer does
    event = asyncio.run(_first_event(revived))

    assert event.payload == {"status": "success", "job_id": op.job_id}
    result = operator(deferrable=True).execute_complete({"ti": ti}, event.payload)
    assert result == op.job_id
    assert ti.xcom[XCOM_PREEMPTIONS] == 1
    assert "was preempted (preemption 1)" in capsys.readouterr().out


async def _first_event(trigger):
    async for event in trigger.run():
        return event


def test_deferrable_failure_surfaces_the_status_reason(queue):
    queue.default_script = ["RUNNING", ("FAILED", "CapacityError: no ml.p4d.24xlarge")]
    ti = RecordingTI()
    op = operator(deferrable=True)
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})

    event = asyncio.run(_first_event(deferred.value.trigger))

    assert event.payload["status"] == "error"
    with pytest.raises(AirflowException, match="FAILED: CapacityError: no ml.p4d.24xlarge"):
        operator(deferrable=True).execute_complete({"ti": ti}, event.payload)


def test_sdk_names_and_their_aliases():
    op = operator(priority=None, scheduling_priority="70", preemption_config={"preemption_retries_before_termination": 0})
    assert (op.priority, op.preemption_retries_before_termination) == ("70", 0)
    with pytest.raises(ValueError, match="give priority or scheduling_priority"):
        operator(priority=1, scheduling_priority=2)
    with pytest.raises(ValueError, match=r"preemption_config: unknown key\(s\) retries; allowed"):
        operator(preemption_config={"retries": 1})
    assert {"training_job_request", "quota_share_name", "priority", "aws_conn_id"} <= set(op.template_fields)


def test_a_priority_outside_0_to_9999_is_refused_before_submitting(queue):
    with pytest.raises(ValueError, match=r"priority: 10000 is not an integer between 0 and 9999"):
        operator(priority="10000").execute({"ti": RecordingTI()})
    assert queue.jobs == {}


def test_update_priority_operator(queue):
    queue.default_script = []
    hook = BatchQuotaShareHook()
    job_id = hook.submit_service_job(
        job_name="j", job_queue=JOB_QUEUE, training_job_request=REQUEST, quota_share_name="team-a",
        scheduling_priority=10,
    )["jobId"]

    result = UpdateServiceJobPriorityOperator(task_id="bump", job_id=job_id, priority=9000).execute({})

    assert result == 9000
    assert queue.jobs[job_id].priority == 9000
    UpdateServiceJobPriorityOperator(task_id="bump", job_id=job_id, scheduling_priority="20").execute({})
    assert queue.jobs[job_id].priority == 20
    with pytest.raises(ValueError, match="give one of priority or scheduling_priority"):
        UpdateServiceJobPriorityOperator(task_id="bump", job_id=job_id)


@pytest.mark.parametrize("code", ["ThrottlingException", "TooManyRequestsException"])
def test_a_throttled_synchronous_wait_backs_off_and_carries_on(queue, code):
    queue.default_script = ["RUNNABLE", "RUNNING", "SUCCEEDED"]
    queue.throttle("DescribeServiceJob", 3, code)  # more than botocore's default 3 attempts

    ti = RecordingTI()
    job_id = operator().execute({"ti": ti})

    assert only_job(queue).status == "SUCCEEDED" and ti.xcom[XCOM_JOB_ID] == job_id
    assert not queue.throttled["DescribeServiceJob"]  # all three were answered, and retried


def test_a_repeated_client_token_is_recognised_by_its_error_code_not_its_text(queue):
    queue.repeated_token_message = "Duplicate request rejected"
    queue.fail_next["DescribeServiceJob"] = "Rate exceeded for this account"
    with pytest.raises(Exception, match="Rate exceeded"):
        operator().execute({"ti": RecordingTI(try_number=1)})
    job = only_job(queue)
    job.script = ["RUNNING", "SUCCEEDED"]
    queue.list_lag[job.job_id] = 1  # the retry's look-up does not list the job yet

    assert operator().execute({"ti": RecordingTI(try_number=2)}) == job.job_id
    assert len(queue.calls_of("SubmitServiceJob")) == 2 and len(queue.jobs) == 1


def test_another_refusal_of_a_resubmission_is_raised_not_taken_for_the_failed_job(queue):
    queue.default_script = ["RUNNING", ("FAILED", "AlgorithmError: bad input")]
    with pytest.raises(AirflowException, match="bad input"):
        operator().execute({"ti": RecordingTI(try_number=1)})
    (share,) = [s for s in queue.shares.values() if s.name == "team-a"]
    share.state = "DISABLED"

    with pytest.raises(ClientError, match="DISABLED and accepts no new jobs"):
        operator().execute({"ti": RecordingTI(try_number=2)})
    assert len(queue.calls_of("SubmitServiceJob")) == 2 and len(queue.jobs) == 1


@pytest.mark.parametrize("request_as", [dict, json.dumps], ids=["dict", "JSON string"])
def test_nodes_are_the_training_jobs_instance_count_and_its_units_of_the_quota_share(queue, request_as):
    queue.default_script = ["RUNNING", "SUCCEEDED"]
    ti = RecordingTI()

    with pytest.raises(TaskDeferred):  # it is RUNNING: the share's usage is read before it ends
        operator(training_job_request=request_as(UNSIZED), nodes=2, deferrable=True).execute({"ti": ti})

    payload = json.loads(queue.calls_of("SubmitServiceJob")[0]["serviceRequestPayload"])
    assert payload == {**UNSIZED, "ResourceConfig": {**UNSIZED["ResourceConfig"], "InstanceCount": 2}}
    in_use = {row["quota_share"]: row["in_use"] for row in BatchQuotaShareHook().quota_share_usage(JOB_QUEUE)}
    assert in_use == {"team-a": 2.0, "team-b": 0.0}
    assert UNSIZED["ResourceConfig"] == {"InstanceType": UNIT, "VolumeSizeInGB": 50}  # the operator's copy


def test_without_nodes_the_request_is_submitted_as_written(queue):
    queue.default_script = ["RUNNING", "SUCCEEDED"]
    written = json.dumps(REQUEST, indent=1)

    operator(training_job_request=written).execute({"ti": RecordingTI()})

    assert queue.calls_of("SubmitServiceJob")[0]["serviceRequestPayload"] == written


def test_nodes_equal_to_the_requests_own_instance_count_are_accepted(queue):
    queue.default_script = ["RUNNING", "SUCCEEDED"]

    operator(nodes=1).execute({"ti": RecordingTI()})

    assert json.loads(queue.calls_of("SubmitServiceJob")[0]["serviceRequestPayload"]) == REQUEST


def test_nodes_that_conflict_with_the_requests_instance_count_are_refused_at_parse_time():
    conflict = r"^nodes: 4 conflicts with training_job_request's ResourceConfig\.InstanceCount 1; set one of them$"
    with pytest.raises(ValueError, match=conflict):
        operator(nodes=4)


def test_nodes_that_conflict_with_a_templated_instance_count_are_refused_once_rendered_before_submitting(queue):
    templated = json.dumps(UNSIZED).replace('"ResourceConfig": {', '"ResourceConfig": {"InstanceCount": {{ params.n }}, ')
    op = operator(training_job_request=templated, nodes=4)  # nothing to compare before rendering

    op.render_template_fields({"params": {"n": 3}})
    conflict = r"^nodes: 4 conflicts with training_job_request's ResourceConfig\.InstanceCount 3; set one of them$"
    with pytest.raises(ValueError, match=conflict):
        op.execute({"ti": RecordingTI()})
    assert queue.calls_of("SubmitServiceJob") == [] and queue.jobs == {}


def test_nodes_cannot_size_a_heterogeneous_cluster():
    groups = {"InstanceGroups": [{"InstanceGroupName": "workers", "InstanceType": UNIT, "InstanceCount": 2}]}
    refusal = r"^nodes: 2 cannot size training_job_request's ResourceConfig\.InstanceGroups \(a heterogeneous cluster\)"
    with pytest.raises(ValueError, match=refusal):
        operator(training_job_request={**UNSIZED, "ResourceConfig": groups}, nodes=2)


@pytest.mark.parametrize("nodes", [0, -1, MAX_NODES + 1, True, 2.0, "2"])
def test_nodes_outside_1_to_max_nodes_are_refused_naming_the_range(nodes):
    allowed = rf"^nodes: {re.escape(repr(nodes))} is not an integer from 1 to {MAX_NODES} or None$"
    with pytest.raises(ValueError, match=allowed):
        operator(training_job_request=UNSIZED, nodes=nodes)


def test_a_request_of_an_instance_type_the_share_has_no_limit_for_is_refused_before_submitting(queue):
    request = {**REQUEST, "ResourceConfig": {**REQUEST["ResourceConfig"], "InstanceType": "ml.p5.48xlarge"}}
    with pytest.raises(ValueError, match=r"^quota_share_name: quota share team-a has no capacity limit for "
                       r"ml\.p5\.48xlarge \(its limits: ml\.p4d\.24xlarge\), so the job would never start in job "
                       r"queue gpu-fleet"):
        operator(training_job_request=request).execute({"ti": RecordingTI()})
    assert queue.calls_of("SubmitServiceJob") == []


def test_more_instances_than_a_share_can_ever_hold_are_refused_before_submitting(queue):
    # team-a: 2 ml.p4d.24xlarge, borrowing unlimited (the queue fixture's quota file): 4 fit.
    queue.default_script = ["RUNNING", "SUCCEEDED"]
    operator(training_job_request=UNSIZED, nodes=4).execute({"ti": RecordingTI()})
    share = next(s for s in queue.shares.values() if s.name == "team-a")
    share.resource_sharing = {"strategy": "LEND"}
    with pytest.raises(ValueError, match=r"4 ml\.p4d\.24xlarge instances exceed quota share team-a's 2 \(at most 2\)"):
        operator(training_job_request=UNSIZED, nodes=4, task_id="train-2").execute({"ti": RecordingTI(task_id="train-2")})
    assert len(queue.calls_of("SubmitServiceJob")) == 1


def test_a_model_trainer_without_the_sagemaker_sdk_names_the_extra(monkeypatch):
    # As where the SDK is not installed (the test environment has it): its import fails.
    monkeypatch.setitem(sys.modules, "sagemaker.train.model_trainer", None)
    with pytest.raises(ValueError, match=r"^model_trainer: needs the SageMaker Python SDK: pip install "
                       r"'airflow-quota-provider\[sagemaker\]'"):
        SageMakerBatchTrainingOperator(task_id="train", job_queue=JOB_QUEUE, model_trainer=object())


def test_inputs_go_with_a_model_trainer_only():
    with pytest.raises(ValueError, match=r"^inputs: only with model_trainer"):
        operator(inputs=[{"ChannelName": "train"}])
