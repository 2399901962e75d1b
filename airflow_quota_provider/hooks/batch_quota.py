"""AWS Batch shared quotas for SageMaker training: the quota file applied to a job queue, and service jobs.

Only this hook talks to boto3. It does two things:

* **Quota shares.** :meth:`BatchQuotaShareHook.plan_quota_shares` lists the quota shares of an AWS
  Batch job queue and hands them, with one queue of a quota file, to the planner
  (:mod:`airflow_quota_provider.aws.plan`), which returns a
  :class:`~airflow_quota_provider.aws.plan.QuotaSharePlan` (create, update, disable, delete);
  :meth:`~BatchQuotaShareHook.apply_plan` carries it out. A second apply plans nothing.
* **Service jobs.** Submit, describe, update the priority of, terminate and list SageMaker training
  jobs queued as Batch service jobs, and read a job queue's snapshot.

The Batch API shapes used here are those of the botocore ``batch`` 2016-08-10 model (boto3 >= 1.42.93).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.config import Config

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_quota_provider.aws.plan import QuotaShareSpec, format_sharing, plan_quota_shares, quota_share_specs

if TYPE_CHECKING:
    from airflow_quota_provider.aws.plan import PlannedChange, QuotaSharePlan
    from airflow_quota_provider.policy import Queue

TASK_INSTANCE_TAG = "airflow-quota-provider:task-instance"

DEFAULT_RETRIES = {"mode": "standard", "max_attempts": 10}
"""How the hook's client retries unless the hook's ``config`` or the connection's ``config_kwargs``
set ``retries``: botocore's standard mode (exponential backoff with jitter, up to 20 s apart, for
throttling and transient errors) with 10 retries, as the Amazon provider's connection form suggests:
about a minute of throttling is waited out. botocore's default (3 attempts, about 1.5 s in all)
gives up on a throttled AWS Batch at once."""


class _ThreadedAsyncWaiter:
    """A botocore waiter whose ``wait`` runs in a worker thread, awaited like aiobotocore's."""

    def __init__(self, waiter: Any) -> None:
        self._waiter = waiter

    async def wait(self, **kwargs: Any) -> None:
        await asyncio.to_thread(self._waiter.wait, **kwargs)


def _aiobotocore_available() -> bool:
    try:
        import aiobotocore  # noqa: F401
    except ImportError:
        return False
    return True


class BatchQuotaShareHook(AwsBaseHook):
    """
    AWS Batch quota shares and SageMaker training service jobs, through ``boto3.client("batch")``.

    :param aws_conn_id: The Airflow connection for AWS credentials (``endpoint_url`` in its extra
        points the client elsewhere, e.g. at a local fake).
    :param region_name: AWS region; the connection's or boto3's default when unset.

    Additional arguments (``verify``, ``config``) are passed down to
    :class:`~airflow.providers.amazon.aws.hooks.base_aws.AwsBaseHook`. Throttled and transient
    errors are retried as :data:`DEFAULT_RETRIES` says, unless ``config`` or the connection's extra
    ``config_kwargs`` set ``retries`` (e.g. ``{"retries": {"mode": "adaptive", "max_attempts": 20}}``).

    The waiters in ``airflow_quota_provider/waiters/batch.json`` (``service_job_complete``,
    ``quota_share_settled``) are this hook's own. Deferred waits use aiobotocore when it is installed
    (the Amazon provider's ``aiobotocore`` extra) and otherwise run the same waiter in a thread.
    """

    SUCCESS_STATE = "SUCCEEDED"
    FAILURE_STATE = "FAILED"
    TERMINAL_STATES = (SUCCESS_STATE, FAILURE_STATE)
    INTERMEDIATE_STATES = ("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING", "RUNNING")
    SERVICE_JOB_TYPE = "SAGEMAKER_TRAINING"
    MIN_PRIORITY, MAX_PRIORITY = 0, 9999
    CLIENT_ERROR_CODE = "ClientException"
    """The error code of every request AWS Batch refuses as the caller's fault, a repeated
    ``clientToken`` included (the only client error the Batch model declares)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["client_type"] = "batch"
        super().__init__(*args, **kwargs)

    @property
    def config(self) -> Config:
        """The client's botocore config: the hook's or the connection's, with :data:`DEFAULT_RETRIES`
        where neither sets ``retries``."""
        config = super().config
        if config.retries is None:
            config = config.merge(Config(retries=dict(DEFAULT_RETRIES)))
        return config

    @cached_property
    def waiter_path(self) -> Path:
        return Path(__file__).parents[1] / "waiters" / "batch.json"

    async def get_async_conn(self):
        """An aiobotocore client when available, else the sync client behind an async context manager."""
        if _aiobotocore_available():
            return await super().get_async_conn()
        client = await asyncio.to_thread(lambda: self.conn)
        return _SyncClientContext(client)

    def get_waiter(
        self,
        waiter_name: str,
        parameters: dict[str, str] | None = None,
        config_overrides: dict[str, Any] | None = None,
        deferrable: bool = False,
        client: Any = None,
    ):
        if deferrable and not _aiobotocore_available():
            sync_waiter = super().get_waiter(waiter_name, parameters, config_overrides, False, client)
            return _ThreadedAsyncWaiter(sync_waiter)
        return super().get_waiter(waiter_name, parameters, config_overrides, deferrable, client)

    # ------------------------------------------------------------------ job queues and quota shares
    def describe_job_queue(self, job_queue: str) -> dict[str, Any]:
        queues = self.conn.describe_job_queues(jobQueues=[job_queue])["jobQueues"]
        if not queues:
            raise ValueError(f"job queue {job_queue!r}: not found in AWS Batch")
        return queues[0]

    def check_job_queue(self, job_queue: str) -> dict[str, Any]:
        """The job queue, if it can hold quota shares for SageMaker training; else a clear error."""
        detail = self.describe_job_queue(job_queue)
        if detail.get("jobQueueType") != self.SERVICE_JOB_TYPE:
            raise ValueError(
                f"job queue {job_queue!r}: jobQueueType is {detail.get('jobQueueType')}, "
                f"quota shares need {self.SERVICE_JOB_TYPE}"
            )
        if not detail.get("schedulingPolicyArn"):
            raise ValueError(
                f"job queue {job_queue!r}: has no scheduling policy; attach one with a quotaSharePolicy "
                "(idleResourceAssignmentStrategy FIFO) before applying quota shares"
            )
        return detail

    def list_quota_shares(self, job_queue: str) -> list[dict[str, Any]]:
        paginator = self.conn.get_paginator("list_quota_shares")
        return [share for page in paginator.paginate(jobQueue=job_queue) for share in page["quotaShares"]]

    def plan_quota_shares(self, job_queue: str, queue: Queue, *, path: str = "queue") -> QuotaSharePlan:
        """Compare the file's queue with the job queue's quota shares; nothing is changed."""
        quota_share_specs(queue, path=path)  # refuse what AWS cannot express before calling it
        self.check_job_queue(job_queue)
        return plan_quota_shares(job_queue, queue, self.list_quota_shares(job_queue), path=path)

    def apply_plan(
        self, plan: QuotaSharePlan, *, wait: bool = True, waiter_delay: int = 5, waiter_max_attempts: int = 60
    ) -> list[PlannedChange]:
        """Make the calls of ``plan`` in order (removals, updates, creations); returns those made.

        A share is DISABLED, and with ``wait`` settled (``quota_share_settled``: status VALID), before
        it is deleted, as AWS Batch requires. With ``wait``, created and updated shares are also
        waited for, so that jobs can be submitted to them when this returns.
        """
        done = []
        to_settle = []
        for change in plan.changes:
            self.log.info("Quota share %s", change.describe())
            if change.action == "create":
                to_settle.append(self.conn.create_quota_share(**change.request)["quotaShareArn"])
            elif change.action == "update":
                self.conn.update_quota_share(**change.request)
                to_settle.append(change.request["quotaShareArn"])
            elif change.action == "disable":
                self.conn.update_quota_share(**change.request)
            elif change.action == "delete":
                if wait:  # the share must be VALID again (its disabling settled) to be deleted
                    self.wait_quota_share_settled(change.request["quotaShareArn"], waiter_delay, waiter_max_attempts)
                self.conn.delete_quota_share(**change.request)
            else:  # pragma: no cover - plans are built above
                raise ValueError(f"unknown action {change.action}")
            done.append(change)
        if wait:
            for arn in to_settle:
                self.wait_quota_share_settled(arn, waiter_delay, waiter_max_attempts)
        return done

    def wait_quota_share_settled(self, quota_share_arn: str, delay: int = 5, max_attempts: int = 60) -> None:
        self.get_waiter("quota_share_settled").wait(
            quotaShareArn=quota_share_arn, WaiterConfig={"Delay": delay, "MaxAttempts": max_attempts}
        )

    # ------------------------------------------------------------------ service jobs
    @classmethod
    def check_priority(cls, priority: int, name: str = "priority") -> int:
        if isinstance(priority, bool) or not isinstance(priority, int) or not (
            cls.MIN_PRIORITY <= priority <= cls.MAX_PRIORITY
        ):
            raise ValueError(
                f"{name}: {priority!r} is not an integer between {cls.MIN_PRIORITY} and {cls.MAX_PRIORITY} "
                "(AWS Batch schedulingPriority)"
            )
        return priority

    def submit_service_job(
        self,
        *,
        job_name: str,
        job_queue: str,
        training_job_request: dict[str, Any] | str,
        quota_share_name: str | None = None,
        scheduling_priority: int | None = None,
        preemption_retries_before_termination: int | None = None,
        retry_strategy: dict[str, Any] | None = None,
        timeout_config: dict[str, Any] | None = None,
        share_identifier: str | None = None,
        tags: dict[str, str] | None = None,
        client_token: str | None = None,
    ) -> dict[str, Any]:
        """SubmitServiceJob for a SageMaker CreateTrainingJob request; returns jobArn, jobName, jobId."""
        payload = training_job_request if isinstance(training_job_request, str) else json.dumps(training_job_request)
        request: dict[str, Any] = {
            "jobName": job_name,
            "jobQueue": job_queue,
            "serviceJobType": self.SERVICE_JOB_TYPE,
            "serviceRequestPayload": payload,
        }
        optional = {
            "quotaShareName": quota_share_name,
            "schedulingPriority": (
                None if scheduling_priority is None else self.check_priority(scheduling_priority, "scheduling_priority")
            ),
            "preemptionConfiguration": (
                None
                if preemption_retries_before_termination is None
                else {"preemptionRetriesBeforeTermination": preemption_retries_before_termination}
            ),
            "retryStrategy": retry_strategy,
            "timeoutConfig": timeout_config,
            "shareIdentifier": share_identifier,
            "tags": tags or None,
            "clientToken": client_token,
        }
        request.update({k: v for k, v in optional.items() if v is not None})
        response = self.conn.submit_service_job(**request)
        response.pop("ResponseMetadata", None)
        return response

    def describe_service_job(self, job_id: str) -> dict[str, Any]:
        response = self.conn.describe_service_job(jobId=job_id)
        response.pop("ResponseMetadata", None)
        return response

    def update_service_job_priority(self, job_id: str, priority: int) -> dict[str, Any]:
        """UpdateServiceJob: the scheduling priority is the only thing that can change."""
        response = self.conn.update_service_job(jobId=job_id, schedulingPriority=self.check_priority(priority))
        response.pop("ResponseMetadata", None)
        return response

    def terminate_service_job(self, job_id: str, reason: str) -> None:
        self.conn.terminate_service_job(jobId=job_id, reason=reason)

    def list_service_jobs(
        self,
        job_queue: str,
        *,
        quota_share_name: str | None = None,
        job_status: str | None = None,
        job_name: str | None = None,
    ) -> list[dict[str, Any]]:
        """ListServiceJobs, all pages. One filter at a time, as the API allows: a job name, or a quota
        share (which combines with ``job_status``). With neither, AWS lists RUNNING jobs only."""
        if job_name and quota_share_name:
            raise ValueError("list_service_jobs: filter by job_name or by quota_share_name, not both")
        kwargs: dict[str, Any] = {"jobQueue": job_queue}
        if job_name:
            kwargs["filters"] = [{"name": "JOB_NAME", "values": [job_name]}]
        elif quota_share_name:
            kwargs["filters"] = [{"name": "QUOTA_SHARE_NAME", "values": [quota_share_name]}]
        if job_status:
            kwargs["jobStatus"] = job_status
        paginator = self.conn.get_paginator("list_service_jobs")
        return [job for page in paginator.paginate(**kwargs) for job in page["jobSummaryList"]]

    def find_service_job(self, job_queue: str, job_name: str, task_instance_key: str) -> dict[str, Any] | None:
        """The newest job named ``job_name`` tagged with ``task_instance_key`` (see TASK_INSTANCE_TAG), or None.

        ListServiceJobs returns the most recent jobs first, so the first match is the newest.
        """
        for summary in self.list_service_jobs(job_queue, job_name=job_name):
            if summary.get("jobName") != job_name:
                continue  # JOB_NAME matching is case-insensitive
            detail = self.describe_service_job(summary["jobId"])
            if (detail.get("tags") or {}).get(TASK_INSTANCE_TAG) == task_instance_key:
                return detail
        return None

    def get_job_queue_snapshot(self, job_queue: str) -> dict[str, Any]:
        response = self.conn.get_job_queue_snapshot(jobQueue=job_queue)
        response.pop("ResponseMetadata", None)
        return response

    def quota_share_usage(self, job_queue: str) -> list[dict[str, Any]]:
        """One row per quota share: capacity, use, borrowing, and RUNNABLE/RUNNING job counts."""
        snapshot = self.get_job_queue_snapshot(job_queue)
        utilization = (snapshot.get("queueUtilization") or {}).get("quotaShareUtilization") or {}
        in_use = {
            entry["quotaShareName"]: {u["capacityUnit"]: u["quantity"] for u in entry.get("capacityUsage", [])}
            for entry in utilization.get("topCapacityUtilization", [])
        }
        front = ((snapshot.get("frontOfQuotaShares") or {}).get("quotaShares")) or {}
        rows = []
        for share in self.list_quota_shares(job_queue):
            name = share["quotaShareName"]
            spec = QuotaShareSpec.from_api(share)
            used = in_use.get(name, {})
            for unit, capacity in spec.capacity_limits or (("", 0),):
                quantity = used.get(unit, 0.0)
                rows.append(
                    {
                        "quota_share": name,
                        "state": share.get("state"),
                        "status": share.get("status"),
                        "strategy": format_sharing(spec),
                        "unit": unit,
                        "capacity": capacity,
                        "in_use": quantity,
                        "borrowed": max(0.0, quantity - capacity),
                        "runnable_jobs": len(
                            self.list_service_jobs(job_queue, quota_share_name=name, job_status="RUNNABLE")
                        ),
                        "running_jobs": len(
                            self.list_service_jobs(job_queue, quota_share_name=name, job_status="RUNNING")
                        ),
                        "front_job": (front.get(name) or [{}])[0].get("jobArn"),
                    }
                )
        return rows

    @staticmethod
    def preempted_attempt_count(description: dict[str, Any]) -> int:
        return int((description.get("preemptionSummary") or {}).get("preemptedAttemptCount") or 0)


class _SyncClientContext(contextlib.AbstractAsyncContextManager):
    """``async with`` over a sync boto3 client (what the base trigger expects of an aiobotocore one)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    async def __aenter__(self) -> Any:
        return self.client

    async def __aexit__(self, *exc: object) -> None:
        return None
