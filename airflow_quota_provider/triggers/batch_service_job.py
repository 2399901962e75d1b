"""Trigger that waits in the triggerer for an AWS Batch service job to finish."""

from __future__ import annotations

from airflow.providers.amazon.aws.triggers.base import AwsBaseWaiterTrigger

from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook


class BatchServiceJobTrigger(AwsBaseWaiterTrigger):
    """
    Poll a Batch service job until it is SUCCEEDED (success event) or FAILED (error event).

    A preempted job goes back to RUNNABLE and is simply waited for; each poll logs the status, the
    preempted-attempt count and the status reason. The waiter is ``service_job_complete`` from this
    provider's ``waiters/batch.json``.

    :param job_id: The service job's ID.
    :param waiter_delay: Seconds between polls.
    :param waiter_max_attempts: Polls before giving up (an error event).
    :param aws_conn_id: The Airflow connection for AWS credentials.
    :param region_name: AWS region.
    """

    aws_hook_class = BatchQuotaShareHook

    def __init__(
        self,
        *,
        job_id: str,
        waiter_delay: int = 30,
        waiter_max_attempts: int = 2880,
        aws_conn_id: str | None = "aws_default",
        **kwargs,
    ) -> None:
        super().__init__(
            serialized_fields={"job_id": job_id},
            waiter_name="service_job_complete",
            waiter_args={"jobId": job_id},
            failure_message=f"Batch service job {job_id} failed",
            status_message=f"Batch service job {job_id} not finished yet",
            status_queries=[
                "status",
                "join('', ['preempted ', to_string(preemptionSummary.preemptedAttemptCount || `0`), ' times'])",
                "statusReason",
            ],
            return_key="job_id",
            return_value=job_id,
            waiter_delay=waiter_delay,
            waiter_max_attempts=waiter_max_attempts,
            aws_conn_id=aws_conn_id,
            **kwargs,
        )
