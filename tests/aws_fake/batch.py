"""A small in-process fake of AWS Batch's quota-share and service-job API.

boto3 reaches it over the real wire protocol (``rest-json`` over HTTP on 127.0.0.1), so the real
serializer, parser, paginators and waiters run. Only the operations this provider uses exist.
Shapes follow the botocore ``batch`` 2016-08-10 model; rules that the model does not carry follow
the AWS documentation (20 quota shares per job queue, a share must be DISABLED before it is
deleted, a DISABLED share accepts no new jobs, a preempted job goes back to RUNNABLE and fails
once ``preemptionRetriesBeforeTermination`` is exhausted, a repeated ``clientToken`` is refused).
:meth:`FakeBatch.throttle` answers the next calls of an operation with AWS's throttling errors.

Scheduling is not simulated: a test moves jobs itself, either directly (:meth:`FakeBatch.start`,
:meth:`FakeBatch.preempt`, :meth:`FakeBatch.succeed`, ...) or with a *script* of steps that
``DescribeServiceJob`` plays one step per call, so a polling operator or waiter sees the job move.
The same test hooks are reachable over HTTP at ``POST /_fake/<method>`` (JSON body = keyword
arguments) for a process that has no handle on the server object.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"
MAX_QUOTA_SHARES_PER_QUEUE = 20

ACTIVE_STATES = ("SCHEDULED", "STARTING", "RUNNING")
TERMINAL_STATES = ("SUCCEEDED", "FAILED")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class FakeClientError(Exception):
    """Answered as HTTP 400 ``ClientException`` (the only client error the Batch model declares)."""


THROTTLING_STATUS = {"ThrottlingException": 400, "TooManyRequestsException": 429}
"""AWS's throttling answers: the common ``ThrottlingException`` (HTTP 400, "Rate exceeded") and the
``TooManyRequestsException`` of HTTP 429. Neither is in the Batch model; botocore's retry handlers
recognise both by their code (and any 429 by its status)."""


class FakeThrottled(Exception):
    """Answered as the throttling error ``code`` with its HTTP status."""

    def __init__(self, code: str) -> None:
        super().__init__("Rate exceeded")
        self.code = code


@dataclass
class JobQueue:
    name: str
    job_queue_type: str = "SAGEMAKER_TRAINING"
    quota_share_policy: bool = True

    @property
    def arn(self) -> str:
        return f"arn:aws:batch:{REGION}:{ACCOUNT}:job-queue/{self.name}"

    def to_api(self) -> dict[str, Any]:
        detail = {
            "jobQueueName": self.name,
            "jobQueueArn": self.arn,
            "state": "ENABLED",
            "status": "VALID",
            "priority": 1,
            "computeEnvironmentOrder": [],
            "serviceEnvironmentOrder": [{"order": 1, "serviceEnvironment": f"{self.name}-env"}],
            "jobQueueType": self.job_queue_type,
        }
        if self.quota_share_policy:
            detail["schedulingPolicyArn"] = f"arn:aws:batch:{REGION}:{ACCOUNT}:scheduling-policy/{self.name}-quota"
        return detail


@dataclass
class QuotaShare:
    name: str
    queue: JobQueue
    capacity_limits: list[dict[str, Any]]
    resource_sharing: dict[str, Any]
    preemption: dict[str, Any]
    state: str = "ENABLED"
    status: str = "VALID"
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def arn(self) -> str:
        return f"{self.queue.arn}/quota-share/{self.name}"

    def to_api(self, *, with_tags: bool) -> dict[str, Any]:
        detail = {
            "quotaShareName": self.name,
            "quotaShareArn": self.arn,
            "jobQueueArn": self.queue.arn,
            "capacityLimits": [dict(limit) for limit in self.capacity_limits],
            "resourceSharingConfiguration": dict(self.resource_sharing),
            "preemptionConfiguration": dict(self.preemption),
            "state": self.state,
            "status": self.status,
        }
        if with_tags and self.tags:
            detail["tags"] = dict(self.tags)
        return detail


@dataclass
class ServiceJob:
    job_id: str
    name: str
    queue: JobQueue
    payload: str
    created_at: int
    priority: int | None = None
    quota_share: str | None = None
    preemption_retries: int | None = None
    retry_strategy: dict[str, Any] | None = None
    timeout_config: dict[str, Any] | None = None
    tags: dict[str, str] = field(default_factory=dict)
    share_identifier: str | None = None
    status: str = "SUBMITTED"
    status_reason: str | None = None
    started_at: int | None = None
    stopped_at: int | None = None
    scheduled_at: int | None = None
    is_terminated: bool = False
    attempts: list[dict[str, Any]] = field(default_factory=list)
    preempted: list[dict[str, Any]] = field(default_factory=list)
    script: list[Any] = field(default_factory=list)
    history: list[str] = field(default_factory=lambda: ["SUBMITTED"])  # every status it has had, in order

    def set_status(self, status: str, reason: str | None = None) -> None:
        self.status, self.status_reason = status, reason
        self.history.append(status)

    @property
    def arn(self) -> str:
        return f"arn:aws:batch:{REGION}:{ACCOUNT}:service-job/{self.job_id}"

    @property
    def capacity_usage(self) -> list[dict[str, Any]]:
        """What the job holds while dispatched: ResourceConfig's instances, in the instance type's unit."""
        if self.status not in ACTIVE_STATES:
            return []
        resources = json.loads(self.payload).get("ResourceConfig") or {}
        unit = resources.get("InstanceType", "ml.m5.large")
        return [{"capacityUnit": unit, "quantity": float(resources.get("InstanceCount", 1))}]

    def _latest(self) -> dict[str, Any] | None:
        if not self.attempts:
            return None
        return {"serviceResourceId": dict(self.attempts[-1]["serviceResourceId"])}

    def summary(self) -> dict[str, Any]:
        out = {
            "jobArn": self.arn,
            "jobId": self.job_id,
            "jobName": self.name,
            "createdAt": self.created_at,
            "serviceJobType": "SAGEMAKER_TRAINING",
            "status": self.status,
            "isTerminated": self.is_terminated,
            "capacityUsage": self.capacity_usage,
        }
        optional = {
            "latestAttempt": self._latest(),
            "quotaShareName": self.quota_share,
            "shareIdentifier": self.share_identifier,
            "statusReason": self.status_reason,
            "scheduledAt": self.scheduled_at,
            "startedAt": self.started_at,
            "stoppedAt": self.stopped_at,
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out

    def describe(self) -> dict[str, Any]:
        out = self.summary()
        out.update(
            {
                "jobQueue": self.queue.arn,
                "serviceRequestPayload": self.payload,
                "attempts": [dict(a) for a in self.attempts],
                # startedAt is required in DescribeServiceJobResponse; 0 until the job first starts.
                "startedAt": self.started_at or 0,
                "preemptionSummary": {
                    "preemptedAttemptCount": len(self.preempted),
                    "recentPreemptedAttempts": [dict(p) for p in self.preempted[-5:]],
                },
            }
        )
        optional = {
            "schedulingPriority": self.priority,
            "retryStrategy": self.retry_strategy,
            "timeoutConfig": self.timeout_config,
            "tags": self.tags or None,
            "preemptionConfiguration": (
                None
                if self.preemption_retries is None
                else {"preemptionRetriesBeforeTermination": self.preemption_retries}
            ),
        }
        out.update({k: v for k, v in optional.items() if v is not None})
        return out


class FakeBatch:
    """The service state and its operations; thread-safe (the HTTP server answers from threads)."""

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._lock = threading.RLock()
        self._clock = clock
        self._ids = itertools.count(1)
        self.queues: dict[str, JobQueue] = {}
        self.shares: dict[str, QuotaShare] = {}  # by ARN
        self.jobs: dict[str, ServiceJob] = {}
        self._client_tokens: dict[str, str] = {}  # clientToken -> jobId
        self.calls: list[tuple[str, dict[str, Any]]] = []  # every API call, for assertions
        self.default_script: list[Any] = []
        self.fail_next: dict[str, str] = {}  # operation -> message, answered once as ClientException
        self.throttled: dict[str, list[str]] = {}  # operation -> throttling codes, answered one per call
        # The ClientException message for a repeated clientToken (AWS documents the refusal, not its text).
        self.repeated_token_message = "A request with clientToken {token} was already received (job {job_id})"
        self.slow_settle = False  # True: a created/updated share is described once as CREATING/UPDATING
        self.list_lag: dict[str, int] = {}  # jobId -> ListServiceJobs calls that do not show it yet

    # ------------------------------------------------------------------ test hooks
    def add_job_queue(
        self, name: str, *, job_queue_type: str = "SAGEMAKER_TRAINING", quota_share_policy: bool = True
    ) -> str:
        with self._lock:
            queue = JobQueue(name, job_queue_type, quota_share_policy)
            self.queues[name] = queue
            return queue.arn

    def job(self, job_id: str) -> ServiceJob:
        with self._lock:
            if job_id not in self.jobs:
                raise FakeClientError(f"Job {job_id} not found")
            return self.jobs[job_id]

    def calls_of(self, operation: str) -> list[dict[str, Any]]:
        return [body for op, body in self.calls if op == operation]

    def throttle(self, operation: str, times: int, code: str = "ThrottlingException") -> None:
        """Answer the next ``times`` calls of ``operation`` with throttling error ``code`` (see
        :data:`THROTTLING_STATUS`), as AWS does when an account's request rate is exceeded."""
        if code not in THROTTLING_STATUS:
            raise ValueError(f"code: {code!r} is not one of {', '.join(THROTTLING_STATUS)}")
        with self._lock:
            self.throttled.setdefault(operation, []).extend([code] * times)

    def set_script(self, job_id: str, steps: Iterable[Any]) -> None:
        """Steps played one per DescribeServiceJob: a status, ``"PREEMPT"``, or ``("FAILED", reason)``."""
        with self._lock:
            self.job(job_id).script = list(steps)

    def make_runnable(self, job_id: str) -> None:
        with self._lock:
            job = self._active(job_id, allowed=("SUBMITTED", "PENDING"))
            job.set_status("RUNNABLE")

    def start(self, job_id: str) -> None:
        """Dispatch a job: a new attempt (a SageMaker training job) that is RUNNING."""
        with self._lock:
            job = self._active(job_id, allowed=("SUBMITTED", "PENDING", "RUNNABLE", "SCHEDULED", "STARTING"))
            now = self._now()
            job.scheduled_at = job.scheduled_at or now
            job.started_at = job.started_at or now
            training_name = json.loads(job.payload).get("TrainingJobName", job.name)
            job.attempts.append(
                {
                    "serviceResourceId": {
                        "name": "TrainingJobArn",
                        "value": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{training_name}-{len(job.attempts) + 1}",
                    },
                    "startedAt": now,
                }
            )
            job.set_status("RUNNING")

    def preempt(self, job_id: str, *, reason: str = "Preempted by a higher priority job") -> None:
        """Stop the running attempt; the job goes back to RUNNABLE, or FAILS past its preemption limit."""
        with self._lock:
            job = self._active(job_id, allowed=ACTIVE_STATES)
            now = self._now()
            attempt = job.attempts[-1]
            attempt.update({"stoppedAt": now, "statusReason": reason})
            job.preempted.append(dict(attempt))
            limit = job.preemption_retries
            if limit is not None and len(job.preempted) > limit:
                job.stopped_at = now
                job.set_status("FAILED", (
                    f"Job preempted {len(job.preempted)} times; preemptionRetriesBeforeTermination "
                    f"({limit}) exhausted. Last preemption: {reason}"
                ))
            else:
                job.set_status("RUNNABLE", reason)

    def succeed(self, job_id: str) -> None:
        with self._lock:
            job = self._active(job_id, allowed=ACTIVE_STATES)
            self._stop(job, "SUCCEEDED", "Training job completed")

    def fail(self, job_id: str, reason: str = "AlgorithmError: training script exited with code 1") -> None:
        with self._lock:
            job = self._active(job_id, allowed=ACTIVE_STATES + ("RUNNABLE",))
            self._stop(job, "FAILED", reason)

    def _stop(self, job: ServiceJob, status: str, reason: str) -> None:
        now = self._now()
        if job.attempts and "stoppedAt" not in job.attempts[-1]:
            job.attempts[-1].update({"stoppedAt": now, "statusReason": reason})
        job.stopped_at = now
        job.set_status(status, reason)

    def _active(self, job_id: str, *, allowed: tuple[str, ...]) -> ServiceJob:
        job = self.job(job_id)
        if job.status not in allowed:
            raise FakeClientError(f"Job {job_id} is {job.status}, expected one of {', '.join(allowed)}")
        return job

    def _play_script(self, job: ServiceJob) -> None:
        if not job.script or job.status in TERMINAL_STATES:
            return
        step = job.script.pop(0)
        if step == "PREEMPT":
            self.preempt(job.job_id)
        elif step == "RUNNING":
            self.start(job.job_id)
        elif step == "SUCCEEDED":
            self.succeed(job.job_id)
        elif isinstance(step, (list, tuple)) and step[0] == "FAILED":
            self.fail(job.job_id, step[1])
        elif step in ("PENDING", "RUNNABLE", "SCHEDULED", "STARTING"):
            job.set_status(step)
        else:
            raise ValueError(f"unknown script step {step!r}")

    def _now(self) -> int:
        return int(self._clock() * 1000)

    # ------------------------------------------------------------------ API
    def handle(self, operation: str, body: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.calls.append((operation, body))
            if self.throttled.get(operation):
                raise FakeThrottled(self.throttled[operation].pop(0))
            if operation in self.fail_next:
                raise FakeClientError(self.fail_next.pop(operation))
            method = getattr(self, f"op_{operation}", None)
            if method is None:
                raise FakeClientError(f"Operation {operation} is not implemented by the fake")
            return method(body)

    def _queue(self, name_or_arn: str | None) -> JobQueue:
        for queue in self.queues.values():
            if name_or_arn in (queue.name, queue.arn):
                return queue
        raise FakeClientError(f"Job queue {name_or_arn} does not exist")

    def _share(self, arn: str) -> QuotaShare:
        if arn not in self.shares:
            raise FakeClientError(f"Quota share {arn} does not exist")
        return self.shares[arn]

    @staticmethod
    def _page(items: list[dict[str, Any]], body: dict[str, Any], key: str) -> dict[str, Any]:
        size = int(body.get("maxResults") or 100)
        if not 1 <= size <= 100:
            raise FakeClientError("maxResults must be between 1 and 100")
        start = int(body.get("nextToken") or 0)
        out: dict[str, Any] = {key: items[start : start + size]}
        if start + size < len(items):
            out["nextToken"] = str(start + size)
        return out

    def op_DescribeJobQueues(self, body: dict[str, Any]) -> dict[str, Any]:
        wanted = body.get("jobQueues")
        queues = [q for q in self.queues.values() if not wanted or q.name in wanted or q.arn in wanted]
        return self._page([q.to_api() for q in queues], body, "jobQueues")

    @staticmethod
    def _check_share_config(body: dict[str, Any]) -> None:
        limits = body.get("capacityLimits")
        if limits is not None:
            if not 1 <= len(limits) <= 5:
                raise FakeClientError("capacityLimits must have between 1 and 5 entries")
            for limit in limits:
                if limit["maxCapacity"] < 0:
                    raise FakeClientError("maxCapacity must be 0 or more")
        sharing = body.get("resourceSharingConfiguration")
        if sharing is not None:
            if sharing["strategy"] not in ("RESERVE", "LEND", "LEND_AND_BORROW"):
                raise FakeClientError(f"Invalid strategy {sharing['strategy']}")
            if "borrowLimit" in sharing:
                if sharing["strategy"] != "LEND_AND_BORROW":
                    raise FakeClientError("borrowLimit can only be applied to LEND_AND_BORROW quota shares")
                if sharing["borrowLimit"] < -1:
                    raise FakeClientError("borrowLimit must be -1 (unlimited) or a percentage of 0 or more")

    def op_CreateQuotaShare(self, body: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(body["jobQueue"])
        name = body["quotaShareName"]
        if not _NAME.match(name):
            raise FakeClientError(f"Invalid quotaShareName {name}")
        if not queue.quota_share_policy:
            raise FakeClientError(f"Job queue {queue.name} has no quota share scheduling policy")
        in_queue = [s for s in self.shares.values() if s.queue is queue]
        if any(s.name == name for s in in_queue):
            raise FakeClientError(f"Quota share {name} already exists in job queue {queue.name}")
        if len(in_queue) >= MAX_QUOTA_SHARES_PER_QUEUE:
            raise FakeClientError(
                f"Job queue {queue.name} already has {MAX_QUOTA_SHARES_PER_QUEUE} quota shares, the maximum"
            )
        self._check_share_config(body)
        share = QuotaShare(
            name=name,
            queue=queue,
            capacity_limits=body["capacityLimits"],
            resource_sharing=body["resourceSharingConfiguration"],
            preemption=body["preemptionConfiguration"],
            state=body.get("state", "ENABLED"),
            status="CREATING",  # VALID once it has been described (the service settles it)
            tags=body.get("tags", {}),
        )
        self.shares[share.arn] = share
        return {"quotaShareName": name, "quotaShareArn": share.arn}

    def op_UpdateQuotaShare(self, body: dict[str, Any]) -> dict[str, Any]:
        share = self._share(body["quotaShareArn"])
        self._check_share_config(body)
        if "capacityLimits" in body:
            share.capacity_limits = body["capacityLimits"]
        if "resourceSharingConfiguration" in body:
            share.resource_sharing = body["resourceSharingConfiguration"]
        if "preemptionConfiguration" in body:
            share.preemption = body["preemptionConfiguration"]
        if "state" in body:
            share.state = body["state"]
        share.status = "UPDATING"
        return {"quotaShareName": share.name, "quotaShareArn": share.arn}

    def op_DescribeQuotaShare(self, body: dict[str, Any]) -> dict[str, Any]:
        share = self._share(body["quotaShareArn"])
        settling = share.status in ("CREATING", "UPDATING")
        if settling and not self.slow_settle:
            share.status = "VALID"
        detail = share.to_api(with_tags=True)
        if settling:  # with slow_settle, one DescribeQuotaShare still sees CREATING/UPDATING
            share.status = "VALID"
        return detail

    def op_DeleteQuotaShare(self, body: dict[str, Any]) -> dict[str, Any]:
        share = self._share(body["quotaShareArn"])
        if share.state != "DISABLED":
            raise FakeClientError(f"Quota share {share.name} must be DISABLED before it can be deleted")
        if share.status != "VALID":
            raise FakeClientError(f"Quota share {share.name} is {share.status}; it can be deleted once VALID")
        for job in self.jobs.values():
            if job.quota_share == share.name and job.queue is share.queue and job.status not in TERMINAL_STATES:
                self._stop(job, "FAILED", f"Quota share {share.name} was deleted")
                job.is_terminated = True
        del self.shares[share.arn]
        return {}

    def op_ListQuotaShares(self, body: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(body["jobQueue"])
        shares = [s.to_api(with_tags=False) for s in self.shares.values() if s.queue is queue]
        return self._page(shares, body, "quotaShares")

    def op_SubmitServiceJob(self, body: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(body["jobQueue"])
        if not _NAME.match(body["jobName"]):
            raise FakeClientError(f"Invalid jobName {body['jobName']}")
        if body["serviceJobType"] != "SAGEMAKER_TRAINING" or queue.job_queue_type != "SAGEMAKER_TRAINING":
            raise FakeClientError("Only SAGEMAKER_TRAINING service jobs on SAGEMAKER_TRAINING job queues")
        try:
            json.loads(body["serviceRequestPayload"])
        except ValueError:
            raise FakeClientError("serviceRequestPayload is not valid JSON") from None
        share_name = body.get("quotaShareName")
        if queue.quota_share_policy:
            if not share_name:
                raise FakeClientError(f"Job queue {queue.name} has a quota share policy: quotaShareName is required")
            shares = [s for s in self.shares.values() if s.queue is queue and s.name == share_name]
            if not shares:
                raise FakeClientError(f"Quota share {share_name} does not exist in job queue {queue.name}")
            if shares[0].state != "ENABLED":
                raise FakeClientError(f"Quota share {share_name} is DISABLED and accepts no new jobs")
        elif share_name:
            raise FakeClientError(f"Job queue {queue.name} has no quota share policy: omit quotaShareName")
        priority = body.get("schedulingPriority")
        if priority is not None and not 0 <= priority <= 9999:
            raise FakeClientError("schedulingPriority must be between 0 and 9999")
        retry = body.get("retryStrategy")
        if retry is not None and not 1 <= retry["attempts"] <= 10:
            raise FakeClientError("retryStrategy.attempts must be between 1 and 10")
        token = body.get("clientToken")
        if token is not None and token in self._client_tokens:
            raise FakeClientError(self.repeated_token_message.format(token=token, job_id=self._client_tokens[token]))
        job = ServiceJob(
            job_id=_job_id(next(self._ids)),
            name=body["jobName"],
            queue=queue,
            payload=body["serviceRequestPayload"],
            created_at=self._now(),
            priority=priority,
            quota_share=share_name,
            preemption_retries=(body.get("preemptionConfiguration") or {}).get("preemptionRetriesBeforeTermination"),
            retry_strategy=retry,
            timeout_config=body.get("timeoutConfig"),
            tags=body.get("tags", {}),
            share_identifier=body.get("shareIdentifier"),
            script=list(self.default_script),
        )
        self.jobs[job.job_id] = job
        if token is not None:
            self._client_tokens[token] = job.job_id
        return {"jobArn": job.arn, "jobName": job.name, "jobId": job.job_id}

    def op_DescribeServiceJob(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(body["jobId"])
        self._play_script(job)
        return job.describe()

    def op_UpdateServiceJob(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(body["jobId"])
        if job.status in TERMINAL_STATES:
            raise FakeClientError(f"Job {job.job_id} is {job.status}; only unfinished jobs can be updated")
        if not 0 <= body["schedulingPriority"] <= 9999:
            raise FakeClientError("schedulingPriority must be between 0 and 9999")
        job.priority = body["schedulingPriority"]
        return {"jobArn": job.arn, "jobName": job.name, "jobId": job.job_id}

    def op_TerminateServiceJob(self, body: dict[str, Any]) -> dict[str, Any]:
        job = self.job(body["jobId"])
        if job.status not in TERMINAL_STATES:
            self._stop(job, "FAILED", body["reason"])
            job.is_terminated = True
        return {}

    def op_ListServiceJobs(self, body: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(body.get("jobQueue"))
        jobs = [j for j in self.jobs.values() if j.queue is queue and not self.list_lag.get(j.job_id)]
        for job_id, lag in list(self.list_lag.items()):
            self.list_lag[job_id] = max(0, lag - 1)
        filters = body.get("filters") or []
        if len(filters) > 1:
            raise FakeClientError("Only one filter can be used at a time")
        status = body.get("jobStatus")
        if filters:
            name, values = filters[0]["name"], filters[0]["values"]
            if name == "JOB_NAME":
                jobs = [j for j in jobs if any(_name_matches(j.name, v) for v in values)]
                status = None  # with a filter other than the share ones, jobStatus is ignored
            elif name == "QUOTA_SHARE_NAME":
                jobs = [j for j in jobs if j.quota_share in values]
            elif name == "SHARE_IDENTIFIER":
                jobs = [j for j in jobs if j.share_identifier in values]
            else:
                raise FakeClientError(f"Unsupported filter {name}")
            if name in ("QUOTA_SHARE_NAME", "SHARE_IDENTIFIER") and status is not None:
                jobs = [j for j in jobs if j.status == status]
        else:
            jobs = [j for j in jobs if j.status == (status or "RUNNING")]
        jobs.sort(key=lambda j: (j.created_at, j.job_id), reverse=True)
        return self._page([j.summary() for j in jobs], body, "jobSummaryList")

    def op_GetJobQueueSnapshot(self, body: dict[str, Any]) -> dict[str, Any]:
        queue = self._queue(body["jobQueue"])
        now = self._now()
        jobs = [j for j in self.jobs.values() if j.queue is queue]
        runnable = sorted(
            (j for j in jobs if j.status == "RUNNABLE"), key=lambda j: (-(j.priority or 0), j.created_at, j.job_id)
        )
        front_of_shares: dict[str, list[dict[str, Any]]] = {}
        for job in runnable:
            if job.quota_share and job.quota_share not in front_of_shares:
                front_of_shares[job.quota_share] = [{"jobArn": job.arn, "earliestTimeAtPosition": job.created_at}]
        total: dict[str, float] = {}
        per_share: dict[str, dict[str, float]] = {}
        for job in jobs:
            for usage in job.capacity_usage:
                unit, quantity = usage["capacityUnit"], usage["quantity"]
                total[unit] = total.get(unit, 0.0) + quantity
                share = per_share.setdefault(job.quota_share or "", {})
                share[unit] = share.get(unit, 0.0) + quantity
        return {
            "frontOfQueue": {
                "jobs": [{"jobArn": j.arn, "earliestTimeAtPosition": j.created_at} for j in runnable[:100]],
                "lastUpdatedAt": now,
            },
            "frontOfQuotaShares": {"quotaShares": front_of_shares, "lastUpdatedAt": now},
            "queueUtilization": {
                "totalCapacityUsage": [{"capacityUnit": u, "quantity": q} for u, q in sorted(total.items())],
                "quotaShareUtilization": {
                    "topCapacityUtilization": [
                        {
                            "quotaShareName": name,
                            "capacityUsage": [{"capacityUnit": u, "quantity": q} for u, q in sorted(usage.items())],
                        }
                        for name, usage in sorted(per_share.items())
                        if name
                    ]
                },
                "lastUpdatedAt": now,
            },
        }


def _job_id(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-{n:012x}"


def _name_matches(name: str, pattern: str) -> bool:
    if pattern.endswith("*"):
        return name.lower().startswith(pattern[:-1].lower())
    return name.lower() == pattern.lower()


_TEST_HOOKS = ("make_runnable", "start", "preempt", "succeed", "fail", "set_script", "add_job_queue", "throttle")


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # keep test output quiet
        return

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            self._send(400, {"message": "request body is not JSON"}, "SerializationException")
            return
        path = self.path.split("?")[0]
        try:
            if path.startswith("/_fake/"):
                hook = path[len("/_fake/") :]
                if hook not in _TEST_HOOKS:
                    raise FakeClientError(f"unknown test hook {hook}; one of {', '.join(_TEST_HOOKS)}")
                result = getattr(self.server.batch, hook)(**body)
                self._send(200, {"result": result})
                return
            operation = self.server.routes.get(path)
            if operation is None:
                raise FakeClientError(f"Unknown path {path}")
            self._send(200, self.server.batch.handle(operation, body))
        except FakeThrottled as error:
            self._send(THROTTLING_STATUS[error.code], {"message": str(error)}, error.code)
        except FakeClientError as error:
            self._send(400, {"message": str(error)}, "ClientException")
        except Exception as error:  # a bug in the fake: answer like the service would, keep serving
            self._send(500, {"message": f"{type(error).__name__}: {error}"}, "ServerException")

    def _send(self, code: int, payload: dict[str, Any], error_type: str | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", "fake-request-id")
        if error_type:
            self.send_header("x-amzn-ErrorType", error_type)
        self.end_headers()
        self.wfile.write(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], batch: FakeBatch, routes: dict[str, str]) -> None:
        super().__init__(address, _Handler)
        self.batch = batch
        self.routes = routes


def _routes() -> dict[str, str]:
    """``requestUri`` -> operation name, read from the installed botocore model (not hard-coded)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("batch")
    return {model.operation_model(name).http["requestUri"]: name for name in model.operation_names}


class FakeBatchServer:
    """Serves a :class:`FakeBatch` on 127.0.0.1 in a daemon thread; use as a context manager."""

    def __init__(self, batch: FakeBatch | None = None) -> None:
        self.batch = batch or FakeBatch()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint_url(self) -> str:
        assert self._server is not None, "server not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeBatchServer:
        # Port 0: the kernel's ephemeral range, apart from the fixed ranges (18000-19999, shifted per
        # pytest-xdist worker) that the Airflow instances of other tests check free and bind seconds later.
        self._server = _Server(("127.0.0.1", 0), self.batch, _routes())
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="aws-batch-fake", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeBatchServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
