"""SageMakerBatchTrainingOperator given the SageMaker Python SDK's own ``ModelTrainer`` (issue 33),
against the local AWS Batch fake over HTTP.

Needs ``sagemaker-train`` (extra ``airflow-quota-provider[sagemaker]``); skipped without it. The SDK
builds the CreateTrainingJob request from the ModelTrainer itself; every AWS call it or the operator
makes goes to the fake (``AWS_ENDPOINT_URL``), none to AWS.
"""

from __future__ import annotations

import json

import pytest
from airflow.sdk.exceptions import TaskDeferred

pytest.importorskip("sagemaker.train", reason="the SageMaker Python SDK (sagemaker-train) is not installed")

from sagemaker.train import ModelTrainer  # noqa: E402
from sagemaker.train.aws_batch.training_queue import TrainingQueue  # noqa: E402
from sagemaker.train.configs import Compute, InputData, OutputDataConfig, StoppingCondition, Tag  # noqa: E402

from tests.aws_fake.fixtures import JOB_QUEUE, aws_fake  # noqa: E402, F401  (fixture)
from tests.operators.test_batch_training import RecordingTI, only_job  # noqa: E402

from airflow_quota_provider.hooks.batch_quota import TASK_INSTANCE_TAG, BatchQuotaShareHook  # noqa: E402
from airflow_quota_provider.operators.batch_training import (  # noqa: E402
    XCOM_JOB_ID,
    SageMakerBatchTrainingOperator,
    task_instance_key,
)
from airflow_quota_provider.policy import parse_quota_file  # noqa: E402

H100 = "ml.p5.48xlarge"
ROLE = "arn:aws:iam::123456789012:role/SageMakerTraining"


@pytest.fixture
def queue(aws_fake, monkeypatch):  # noqa: F811
    """team-a: 2 H100 instances, borrowing up to 100% more; team-b: 2, reserved."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws_fake.endpoint_url)  # the SDK's own clients reach the fake too
    monkeypatch.setenv("SAGEMAKER_VALIDATE_ROLE", "false")  # no IAM in the fake
    quotas = parse_quota_file(
        {
            "queues": [
                {
                    "name": JOB_QUEUE,
                    "capacity": 4,
                    "capacity_unit": H100,
                    "quotas": [
                        {"name": "team-a", "capacity": 2, "borrow_limit": 2},
                        {"name": "team-b", "capacity": 2, "sharing": "reserve"},
                    ],
                }
            ]
        }
    ).queues[0]
    hook = BatchQuotaShareHook()
    hook.apply_plan(hook.plan_quota_shares(JOB_QUEUE, quotas), waiter_delay=0)
    return aws_fake


def trainer(instance_type: str = H100, instance_count: int = 2) -> ModelTrainer:
    return ModelTrainer(
        training_image="example/train:1",
        role=ROLE,
        base_job_name="llama-ft",
        compute=Compute(instance_type=instance_type, instance_count=instance_count),
        output_data_config=OutputDataConfig(s3_output_path="s3://example-bucket/out"),
        stopping_condition=StoppingCondition(max_runtime_in_seconds=3600),
        hyperparameters={"epochs": 3},
        tags=[Tag(key="project", value="llama")],
    )


def operator(model_trainer: ModelTrainer, **kwargs) -> SageMakerBatchTrainingOperator:
    args = dict(
        task_id="train",
        job_queue=JOB_QUEUE,
        model_trainer=model_trainer,
        inputs=[InputData(channel_name="train", data_source="s3://example-bucket/train")],
        quota_share_name="team-a",
        priority=0,
        waiter_delay=0,
        waiter_max_attempts=20,
        deferrable=False,
    )
    args.update(kwargs)
    return SageMakerBatchTrainingOperator(**args)


def test_a_model_trainer_is_submitted_with_its_request_and_priority_0(queue):
    queue.default_script = ["RUNNABLE", "RUNNING", "SUCCEEDED"]
    ti = RecordingTI()

    job_id = operator(trainer()).execute({"ti": ti})

    assert ti.xcom[XCOM_JOB_ID] == job_id == only_job(queue).job_id
    body = queue.calls_of("SubmitServiceJob")[0]
    assert body["schedulingPriority"] == 0
    assert body["quotaShareName"] == "team-a"
    assert body["tags"] == {"project": "llama", TASK_INSTANCE_TAG: task_instance_key(ti)}
    request = json.loads(body["serviceRequestPayload"])
    assert request["ResourceConfig"]["InstanceType"] == H100
    assert request["ResourceConfig"]["InstanceCount"] == 2
    assert request["RoleArn"] == ROLE
    assert request["HyperParameters"] == {"epochs": "3"}
    assert [channel["ChannelName"] for channel in request["InputDataConfig"]] == ["train"]
    assert "Tags" not in request
    assert only_job(queue).history[-1] == "SUCCEEDED"


def test_the_sdks_own_training_queue_drops_priority_0_which_the_operator_keeps(queue):
    """Why the operator submits the request itself: TrainingQueue.submit sends no schedulingPriority for 0."""
    TrainingQueue(JOB_QUEUE).submit(trainer(), inputs=None, priority=0, quota_share_name="team-a")
    assert "schedulingPriority" not in queue.calls_of("SubmitServiceJob")[0]


def test_the_instances_held_in_the_share_are_the_trainers_instance_type_and_count(queue):
    ti = RecordingTI()
    with pytest.raises(TaskDeferred):  # 3 fits team-a's 2 and its 100% borrowing
        operator(trainer(instance_count=3), deferrable=True).execute({"ti": ti})
    queue.start(ti.xcom[XCOM_JOB_ID])

    snapshot = BatchQuotaShareHook().get_job_queue_snapshot(JOB_QUEUE)
    usage = snapshot["queueUtilization"]["quotaShareUtilization"]["topCapacityUtilization"]
    assert [(u["quotaShareName"], u["capacityUsage"]) for u in usage] == [
        ("team-a", [{"capacityUnit": H100, "quantity": 3.0}])
    ]


def test_an_instance_type_the_share_has_no_limit_for_is_refused_before_submitting(queue):
    with pytest.raises(ValueError, match=r"^quota_share_name: quota share team-a has no capacity limit for "
                       r"ml\.p4d\.24xlarge \(its limits: ml\.p5\.48xlarge\), so the job would never start"):
        operator(trainer(instance_type="ml.p4d.24xlarge")).execute({"ti": RecordingTI()})
    assert queue.calls_of("SubmitServiceJob") == []


@pytest.mark.parametrize(("share", "count", "message"), [
    ("team-a", 5, r"5 ml\.p5\.48xlarge instances exceed quota share team-a's 2 with borrowLimit 100% \(at most 4\)"),
    ("team-b", 3, r"3 ml\.p5\.48xlarge instances exceed quota share team-b's 2 \(at most 2\)"),
])
def test_more_instances_than_the_share_can_ever_hold_are_refused_before_submitting(queue, share, count, message):
    with pytest.raises(ValueError, match=message):
        operator(trainer(instance_count=count), quota_share_name=share).execute({"ti": RecordingTI()})
    assert queue.calls_of("SubmitServiceJob") == []


def test_nodes_that_conflict_with_the_trainers_instance_count_are_refused_at_parse_time(queue):
    with pytest.raises(ValueError, match=r"^nodes: 4 conflicts with model_trainer's compute\.instance_count 2"):
        operator(trainer(), nodes=4)


def test_nodes_equal_to_the_trainers_instance_count_are_accepted(queue):
    queue.default_script = ["RUNNING", "SUCCEEDED"]
    operator(trainer(), nodes=2).execute({"ti": RecordingTI()})
    assert json.loads(queue.calls_of("SubmitServiceJob")[0]["serviceRequestPayload"])["ResourceConfig"]["InstanceCount"] == 2


def test_something_else_than_a_model_trainer_is_refused(queue):
    with pytest.raises(ValueError, match=r"^model_trainer: dict is not a sagemaker\.train ModelTrainer"):
        operator({"InstanceType": H100})


def test_a_trainer_and_a_request_together_are_refused(queue):
    with pytest.raises(ValueError, match=r"^give one of training_job_request or model_trainer"):
        operator(trainer(), training_job_request={"ResourceConfig": {}})
