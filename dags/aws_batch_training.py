"""Fine-tune on SageMaker through an AWS Batch job queue with shared quotas: the same quota file, on AWS.

**Needs an AWS account.** ``aws_batch_training`` and ``aws_batch_set_priority`` call AWS Batch and
SageMaker through the ``aws_default`` connection. The local demo (``./scripts/run``, docker compose)
lists them but has no AWS to talk to: a run there fails at its first AWS call. Give Airflow an
``aws_default`` connection and the job queue below first (docs/aws-batch.md).

Apply the quota file to the job queue first (plan shown, nothing changed with ``--dry-run``)::

    airflow quota apply --backend aws-batch --job-queue gpu-fleet --dry-run quotas-aws.yaml
    airflow quota apply --backend aws-batch --job-queue gpu-fleet quotas-aws.yaml

where ``quotas-aws.yaml`` counts capacity in instances of ``capacity_unit``::

    queues:
      - name: gpu-fleet
        capacity: 8
        capacity_unit: ml.p4d.24xlarge   # AWS: capacities count instances of this type
        quotas:
          - {name: team-a, capacity: 4, borrow_limit: 2}          # may borrow up to 50% more
          - {name: team-b, capacity: 2, sharing: lend}
          - {name: inference, capacity: 2, sharing: reserve, preemption: {within_quota: never}}

``aws_batch_training`` queues one training job on quota share ``team-a``. Batch starts it when the
share has room, may preempt it for a higher-priority job (it goes back to RUNNABLE; the task logs
each preemption and pushes ``preempted_attempt_count`` to XCom) and fails it after three
preemptions. A retry of the task waits for the same job instead of submitting a second one.
While it waits, ``aws_batch_set_priority`` (or ``airflow quota set-priority --backend aws-batch``)
moves it ahead of the share's other jobs; ``airflow quota status --backend aws-batch --job-queue
gpu-fleet`` shows each share's use.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pendulum

from airflow.sdk import DAG, Param

from airflow_quota_provider.operators.batch_training import (
    SageMakerBatchTrainingOperator,
    UpdateServiceJobPriorityOperator,
)

# Seconds between status checks of the job; a local test sets it low.
POLL_SECONDS = int(os.environ.get("AWS_BATCH_EXAMPLE_POLL_SECONDS", "60"))

TRAINING_JOB_REQUEST = {
    # A SageMaker CreateTrainingJob request; every string is a template.
    "TrainingJobName": "llama-ft-{{ ts_nodash }}",
    "RoleArn": "{{ params.role_arn }}",
    "AlgorithmSpecification": {
        "TrainingImage": "{{ params.training_image }}",
        "TrainingInputMode": "File",
    },
    "HyperParameters": {"epochs": "3", "lr": "2e-5"},
    "InputDataConfig": [
        {
            "ChannelName": "train",
            "DataSource": {
                "S3DataSource": {
                    "S3DataType": "S3Prefix",
                    "S3Uri": "s3://{{ params.bucket }}/datasets/instructions/",
                    "S3DataDistributionType": "FullyReplicated",
                }
            },
        }
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://{{ params.bucket }}/models/"},
    "CheckpointConfig": {"S3Uri": "s3://{{ params.bucket }}/checkpoints/{{ run_id | replace(':', '_') }}/"},
    "ResourceConfig": {"InstanceType": "ml.p4d.24xlarge", "InstanceCount": 1, "VolumeSizeInGB": 200},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
}

with DAG(
    dag_id="aws_batch_training",
    description="Needs AWS: SageMaker fine-tune on AWS Batch quota share team-a, preemptible, at most 3 preemptions",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["quota", "aws-batch", "example"],
    params={
        "job_queue": Param("gpu-fleet", type="string", description="AWS Batch job queue (SAGEMAKER_TRAINING)"),
        "quota_share": Param("team-a", type="string", description="Quota share (the quota file's quota)"),
        "priority": Param(50, type="integer", minimum=0, maximum=9999, description="schedulingPriority"),
        "role_arn": Param("arn:aws:iam::123456789012:role/SageMakerTraining", type="string"),
        "training_image": Param("123456789012.dkr.ecr.us-east-1.amazonaws.com/llama-ft:latest", type="string"),
        "bucket": Param("my-ml-bucket", type="string"),
    },
) as training_dag:
    SageMakerBatchTrainingOperator(
        task_id="train",
        job_queue="{{ params.job_queue }}",
        quota_share_name="{{ params.quota_share }}",
        priority="{{ params.priority }}",
        preemption_config={"preemptionRetriesBeforeTermination": 3},
        retry_strategy={"attempts": 2},
        timeout_config={"attemptDurationSeconds": 86400},
        training_job_request=TRAINING_JOB_REQUEST,
        tags={"team": "{{ params.quota_share }}"},
        deferrable=True,
        waiter_delay=POLL_SECONDS,
        retries=1,
        retry_delay=timedelta(seconds=0),
    )

with DAG(
    dag_id="aws_batch_set_priority",
    description="Needs AWS: change the schedulingPriority of a queued or running AWS Batch service job",
    doc_md=__doc__,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["quota", "aws-batch", "example"],
    params={
        "job_id": Param("", type="string", description="Service job ID (XCom service_job_id of the train task)"),
        "priority": Param(9000, type="integer", minimum=0, maximum=9999),
    },
) as priority_dag:
    UpdateServiceJobPriorityOperator(task_id="set_priority", job_id="{{ params.job_id }}",
                                     priority="{{ params.priority }}")
