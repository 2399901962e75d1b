"""Sensor for AWS Batch service jobs (SageMaker training jobs on shared quotas)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.amazon.aws.sensors.base_aws import AwsBaseSensor
from airflow.providers.amazon.aws.utils.mixins import aws_template_fields
from airflow.providers.common.compat.sdk import AirflowException, conf

from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook
from airflow_quota_provider.triggers.batch_service_job import BatchServiceJobTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context


class BatchServiceJobSensor(AwsBaseSensor[BatchQuotaShareHook]):
    """
    Wait for a Batch service job to succeed; fail when it fails.

    ``poke`` is True once the job is SUCCEEDED, False while it is in any of
    ``BatchQuotaShareHook.INTERMEDIATE_STATES`` (a preempted job is RUNNABLE again, so it keeps
    waiting), and raises an error naming the status and its reason when it is FAILED.

    :param job_id: The service job's ID. (templated)
    :param deferrable: Wait in the triggerer; default ``[operators] default_deferrable``.
    :param poke_interval: Seconds between checks.
    :param max_retries: Checks before giving up, in deferrable mode.
    """

    aws_hook_class = BatchQuotaShareHook
    template_fields: Sequence[str] = aws_template_fields("job_id")
    ui_color = "#66c3ff"

    def __init__(
        self,
        *,
        job_id: str,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 30,
        max_retries: int = 2880,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.job_id = job_id
        self.deferrable = deferrable
        self.max_retries = max_retries

    def poke(self, context: Context) -> bool:
        description = self.hook.describe_service_job(self.job_id)
        status = description["status"]
        preempted = BatchQuotaShareHook.preempted_attempt_count(description)
        if status == BatchQuotaShareHook.SUCCESS_STATE:
            return True
        if status in BatchQuotaShareHook.INTERMEDIATE_STATES:
            self.log.info("Service job %s is %s (preempted %d time(s))", self.job_id, status, preempted)
            return False
        raise AirflowException(
            f"Service job {self.job_id} is {status}: {description.get('statusReason') or 'no reason given'}"
            f" (preempted {preempted} time(s))"
        )

    def execute(self, context: Context) -> None:
        if not self.deferrable:
            super().execute(context=context)
            return
        self.defer(
            timeout=timedelta(seconds=self.max_retries * self.poke_interval + 60),
            trigger=BatchServiceJobTrigger(
                job_id=self.job_id,
                waiter_delay=int(self.poke_interval),
                waiter_max_attempts=self.max_retries,
                aws_conn_id=self.aws_conn_id,
                region_name=self.region_name,
                verify=self.verify,
                botocore_config=self.botocore_config,
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> None:
        if not event or event.get("status") != "success":
            raise AirflowException(f"Service job {self.job_id}: {(event or {}).get('message', 'no event')}")
        self.log.info("Service job %s SUCCEEDED", event["job_id"])
