"""AWS Batch shared quotas for SageMaker training: the quota file applied to a job queue, and service jobs.

Only this hook talks to boto3. It does two things:

* **Quota shares.** :meth:`BatchQuotaShareHook.plan_quota_shares` compares one queue of a quota file
  with the quota shares of an AWS Batch job queue and returns a :class:`QuotaSharePlan` (create,
  update, disable, delete); :meth:`~BatchQuotaShareHook.apply_plan` carries it out. A second apply
  plans nothing. How a quota maps onto a quota share is :func:`quota_share_specs`; what AWS Batch
  cannot express is refused with a :class:`~airflow_quota_provider.policy.PolicyError` that names the
  field, rather than applied with a different meaning.
* **Service jobs.** Submit, describe, update the priority of, terminate and list SageMaker training
  jobs queued as Batch service jobs, and read a job queue's snapshot.

The Batch API shapes used here are those of the botocore ``batch`` 2016-08-10 model (boto3 >= 1.42.93).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore.config import Config

from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook

from airflow_quota_provider.policy import PolicyError

if TYPE_CHECKING:
    from airflow_quota_provider.policy import Queue, Quota

MAX_QUOTA_SHARES_PER_QUEUE = 20
"""AWS Batch's documented limit of quota shares per job queue (not in the service model)."""

MANAGED_TAG = "airflow-quota-provider:managed"
TASK_INSTANCE_TAG = "airflow-quota-provider:task-instance"

_STRATEGY = {"reserve": "RESERVE", "lend": "LEND", "lend_and_borrow": "LEND_AND_BORROW"}
_IN_SHARE_PREEMPTION = {"never": "DISABLED", "lower_priority": "ENABLED"}
UNLIMITED_BORROW = -1

DEFAULT_RETRIES = {"mode": "standard", "max_attempts": 10}
"""How the hook's client retries unless the hook's ``config`` or the connection's ``config_kwargs``
set ``retries``: botocore's standard mode (exponential backoff with jitter, up to 20 s apart, for
throttling and transient errors) with 10 retries, as the Amazon provider's connection form suggests:
about a minute of throttling is waited out. botocore's default (3 attempts, about 1.5 s in all)
gives up on a throttled AWS Batch at once."""

# Quota-file fields that only the local executor uses; a non-default value is reported in the plan.
_LOCAL_ONLY = {
    "weight": 1.0,
    "max_priority": None,
    "grace_period_s": 120.0,
    "min_runtime_s": 0.0,
    "spare_finishing_within_s": 0.0,
    "preemption_delay_s": 0.0,
    "on_preemption_limit": "fail",
}


@dataclass(frozen=True)
class QuotaShareSpec:
    """The quota share a quota file asks for, in AWS Batch's terms."""

    name: str
    capacity_limits: tuple[tuple[str, int], ...]  # (capacityUnit, maxCapacity)
    strategy: str
    borrow_limit: int | None  # percent, -1 = unlimited; None unless LEND_AND_BORROW
    in_share_preemption: str

    def capacity_limits_api(self) -> list[dict[str, Any]]:
        return [{"maxCapacity": cap, "capacityUnit": unit} for unit, cap in self.capacity_limits]

    def resource_sharing_api(self) -> dict[str, Any]:
        config: dict[str, Any] = {"strategy": self.strategy}
        if self.borrow_limit is not None:
            config["borrowLimit"] = self.borrow_limit
        return config

    def preemption_api(self) -> dict[str, Any]:
        return {"inSharePreemption": self.in_share_preemption}

    @classmethod
    def from_api(cls, detail: dict[str, Any]) -> QuotaShareSpec:
        """What AWS holds now, normalized so that it compares equal to an unchanged spec."""
        sharing = detail.get("resourceSharingConfiguration") or {}
        strategy = sharing.get("strategy", "")
        borrow = sharing.get("borrowLimit", UNLIMITED_BORROW) if strategy == "LEND_AND_BORROW" else None
        return cls(
            name=detail["quotaShareName"],
            capacity_limits=tuple(
                sorted((limit["capacityUnit"], limit["maxCapacity"]) for limit in detail.get("capacityLimits", []))
            ),
            strategy=strategy,
            borrow_limit=borrow,
            in_share_preemption=(detail.get("preemptionConfiguration") or {}).get("inSharePreemption", ""),
        )


def borrow_limit_percent(borrow_limit: int | None, capacity: int, path: str) -> int:
    """Our ``borrow_limit`` (capacity units above the quota's capacity) as AWS's whole percentage of it.

    AWS's ``borrowLimit`` is a percentage of ``maxCapacity`` (-1 = unlimited), so only limits that are
    a whole percentage of the capacity can be expressed; any other is refused with the nearest ones.
    """
    if borrow_limit is None:
        return UNLIMITED_BORROW
    if borrow_limit == 0:
        return 0
    if capacity == 0:
        raise PolicyError(
            path,
            f"{borrow_limit} cannot be expressed on AWS Batch: borrowLimit is a percentage of the quota's "
            "capacity, which is 0; use null (unlimited) or 0",
        )
    percent, remainder = divmod(borrow_limit * 100, capacity)
    if remainder == 0:
        return percent
    lower = next(b for b in range(borrow_limit, -1, -1) if b * 100 % capacity == 0)
    upper = next(b for b in range(borrow_limit, borrow_limit + capacity + 1) if b * 100 % capacity == 0)
    raise PolicyError(
        path,
        f"{borrow_limit} is {borrow_limit * 100 / capacity:.4g}% of the quota's capacity {capacity}; AWS Batch's "
        f"borrowLimit is a whole percentage: use {lower} ({lower * 100 // capacity}%) or "
        f"{upper} ({upper * 100 // capacity}%), or null (unlimited)",
    )


def quota_share_specs(queue: Queue, *, path: str = "queue") -> list[QuotaShareSpec]:
    """Map one quota-file queue onto AWS Batch quota shares, refusing what AWS cannot express.

    * ``capacity`` is counted in the queue's ``capacity_unit`` (an instance type such as
      ``ml.p4d.24xlarge``), AWS's ``maxCapacity``; the unit is required for this backend.
    * ``sharing`` -> ``resourceSharingConfiguration.strategy``; ``borrow_limit`` -> ``borrowLimit``
      (a whole percentage of the capacity, -1 when null).
    * ``preemption.within_quota`` -> ``inSharePreemption`` (``never`` DISABLED, ``lower_priority``
      ENABLED). AWS always reclaims lent capacity whatever the borrower's priority, which is our
      ``reclaim: any``; ``lend_limit``, ``borrow_within`` and ``lower_or_newer_equal_priority`` have no
      AWS counterpart and are refused.
    * ``cohorts`` are refused: AWS Batch quota shares are one flat list per job queue, and no
      flattening keeps what a tree guarantees (a cohort's own capacity, its limits, reclaim by level).
    """
    quotas = tuple(queue.quotas)
    if queue.cohorts:
        raise PolicyError(
            f"{path}.cohorts",
            "AWS Batch quota shares are flat: a job queue's shares cannot be grouped in cohorts; "
            "give this queue a file without cohorts for the aws-batch backend",
        )
    if len(quotas) > MAX_QUOTA_SHARES_PER_QUEUE:
        raise PolicyError(
            f"{path}.quotas",
            f"{len(quotas)} quotas; an AWS Batch job queue holds at most {MAX_QUOTA_SHARES_PER_QUEUE} quota shares",
        )
    if not queue.capacity_unit:
        raise PolicyError(
            f"{path}.capacity_unit",
            "required for the aws-batch backend: the instance type that capacities count, such as ml.p4d.24xlarge",
        )
    return [_quota_share_spec(quota, queue.capacity_unit, f"{path}.quotas[{i}]") for i, quota in enumerate(quotas)]


def _quota_share_spec(quota: Quota, unit: str, path: str) -> QuotaShareSpec:
    if quota.sharing not in _STRATEGY:
        raise PolicyError(f"{path}.sharing", f"{quota.sharing!r} is not one of {', '.join(_STRATEGY)}")
    if quota.lend_limit is not None:
        raise PolicyError(
            f"{path}.lend_limit",
            "AWS Batch quota shares have no lend limit: remove it (lend all idle capacity) or use sharing: reserve",
        )
    policy = quota.preemption
    if policy.within_quota not in _IN_SHARE_PREEMPTION:
        raise PolicyError(
            f"{path}.preemption.within_quota",
            f"{policy.within_quota!r} has no AWS Batch counterpart; use one of {', '.join(_IN_SHARE_PREEMPTION)}",
        )
    if quota.sharing != "reserve" and policy.reclaim != "any":
        raise PolicyError(
            f"{path}.preemption.reclaim",
            f"{policy.reclaim!r}: AWS Batch always reclaims lent capacity whatever the borrower's priority; use any",
        )
    if policy.borrow_within is not None:
        raise PolicyError(
            f"{path}.preemption.borrow_within", "AWS Batch has no borrow-within preemption; remove it (null)"
        )
    borrow = None
    if quota.sharing == "lend_and_borrow":
        borrow = borrow_limit_percent(quota.borrow_limit, quota.capacity, f"{path}.borrow_limit")
    return QuotaShareSpec(
        name=quota.name,
        capacity_limits=((unit, quota.capacity),),
        strategy=_STRATEGY[quota.sharing],
        borrow_limit=borrow,
        in_share_preemption=_IN_SHARE_PREEMPTION[policy.within_quota],
    )


def local_only_notes(queue: Queue) -> list[str]:
    """Quota fields set in the file that AWS Batch quota shares do not carry (shown with the plan)."""
    notes = []
    for quota in queue.quotas:
        for name, default in _LOCAL_ONLY.items():
            value = getattr(quota, name)
            if value != default:
                shown = f"{value:g}" if isinstance(value, float) else value
                notes.append(f"{quota.name}: {name}={shown} applies to the local executor only")
        if quota.max_preemptions is not None:
            notes.append(
                f"{quota.name}: max_preemptions={quota.max_preemptions} is set per job on AWS Batch "
                "(SageMakerBatchTrainingOperator preemption_retries_before_termination)"
            )
    return notes


@dataclass(frozen=True)
class PlannedChange:
    """One call that :meth:`BatchQuotaShareHook.apply_plan` will make."""

    action: str  # create | update | disable | delete
    name: str
    request: dict[str, Any]
    changes: tuple[str, ...] = ()

    def describe(self) -> str:
        detail = f" ({'; '.join(self.changes)})" if self.changes else ""
        return f"{self.action:<7} {self.name}{detail}"


@dataclass(frozen=True)
class QuotaSharePlan:
    """What it takes to make a job queue's quota shares match a quota file; empty when they do."""

    job_queue: str
    changes: tuple[PlannedChange, ...]
    unchanged: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def empty(self) -> bool:
        return not self.changes

    def render(self) -> str:
        lines = [f"Quota shares of AWS Batch job queue {self.job_queue}:"]
        lines += [f"  {change.describe()}" for change in self.changes]
        lines += [f"  ok      {name}" for name in self.unchanged]
        if self.empty:
            lines.append("  nothing to change")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "job_queue": self.job_queue,
            "changes": [
                {"action": c.action, "name": c.name, "changes": list(c.changes), "request": c.request}
                for c in self.changes
            ],
            "unchanged": list(self.unchanged),
            "notes": list(self.notes),
        }


def _diff(want: QuotaShareSpec, have: QuotaShareSpec, state: str) -> tuple[dict[str, Any], list[str]]:
    request: dict[str, Any] = {}
    changes: list[str] = []
    if want.capacity_limits != have.capacity_limits:
        request["capacityLimits"] = want.capacity_limits_api()
        changes.append(f"capacity {_fmt_limits(have)} -> {_fmt_limits(want)}")
    if (want.strategy, want.borrow_limit) != (have.strategy, have.borrow_limit):
        request["resourceSharingConfiguration"] = want.resource_sharing_api()
        changes.append(f"sharing {_fmt_sharing(have)} -> {_fmt_sharing(want)}")
    if want.in_share_preemption != have.in_share_preemption:
        request["preemptionConfiguration"] = want.preemption_api()
        changes.append(f"inSharePreemption {have.in_share_preemption} -> {want.in_share_preemption}")
    if state != "ENABLED":
        request["state"] = "ENABLED"
        changes.append(f"state {state} -> ENABLED")
    return request, changes


def _fmt_limits(spec: QuotaShareSpec) -> str:
    return ", ".join(f"{cap} {unit}" for unit, cap in spec.capacity_limits) or "none"


def _fmt_sharing(spec: QuotaShareSpec) -> str:
    if spec.borrow_limit is None:
        return spec.strategy
    limit = "unlimited" if spec.borrow_limit == UNLIMITED_BORROW else f"{spec.borrow_limit}%"
    return f"{spec.strategy} borrowLimit {limit}"


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
        wanted = quota_share_specs(queue, path=path)
        self.check_job_queue(job_queue)
        existing = {share["quotaShareName"]: share for share in self.list_quota_shares(job_queue)}
        removals: list[PlannedChange] = []
        updates: list[PlannedChange] = []
        creations: list[PlannedChange] = []
        unchanged: list[str] = []
        for name, share in existing.items():
            if name in {spec.name for spec in wanted} or share.get("status") == "DELETING":
                continue
            arn = share["quotaShareArn"]
            if share.get("state") != "DISABLED":
                removals.append(PlannedChange("disable", name, {"quotaShareArn": arn, "state": "DISABLED"}))
            removals.append(PlannedChange("delete", name, {"quotaShareArn": arn}, ("not in the quota file",)))
        for spec in wanted:
            share = existing.get(spec.name)
            if share is None:
                creations.append(
                    PlannedChange(
                        "create",
                        spec.name,
                        {
                            "quotaShareName": spec.name,
                            "jobQueue": job_queue,
                            "capacityLimits": spec.capacity_limits_api(),
                            "resourceSharingConfiguration": spec.resource_sharing_api(),
                            "preemptionConfiguration": spec.preemption_api(),
                            "state": "ENABLED",
                            "tags": {MANAGED_TAG: "true"},
                        },
                        (f"capacity {_fmt_limits(spec)}", _fmt_sharing(spec), f"inSharePreemption {spec.in_share_preemption}"),
                    )
                )
                continue
            if share.get("status") == "DELETING":
                raise PolicyError(
                    f"{path}.quotas",
                    f"quota share {spec.name!r} is being deleted in job queue {job_queue}; apply again once it is gone",
                )
            request, changes = _diff(spec, QuotaShareSpec.from_api(share), share.get("state", "ENABLED"))
            if request:
                request["quotaShareArn"] = share["quotaShareArn"]
                updates.append(PlannedChange("update", spec.name, request, tuple(changes)))
            else:
                unchanged.append(spec.name)
        remaining = len(existing) - sum(1 for c in removals if c.action == "delete") + len(creations)
        if remaining > MAX_QUOTA_SHARES_PER_QUEUE:
            raise PolicyError(
                f"{path}.quotas",
                f"job queue {job_queue} would hold {remaining} quota shares; AWS Batch allows at most "
                f"{MAX_QUOTA_SHARES_PER_QUEUE}",
            )
        return QuotaSharePlan(
            job_queue=job_queue,
            changes=tuple(removals + updates + creations),
            unchanged=tuple(unchanged),
            notes=tuple(local_only_notes(queue)),
        )

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
                        "strategy": _fmt_sharing(spec),
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
