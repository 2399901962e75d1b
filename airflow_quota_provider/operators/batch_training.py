"""Operators for SageMaker training jobs queued on AWS Batch shared quotas."""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from airflow.providers.amazon.aws.operators.base_aws import AwsBaseOperator
from airflow.providers.amazon.aws.utils import validate_execute_complete_event
from airflow.providers.amazon.aws.utils.mixins import aws_template_fields
from airflow.providers.common.compat.sdk import AirflowException, conf

from airflow_quota_provider.aws.plan import UNLIMITED_BORROW, QuotaShareSpec
from airflow_quota_provider.hooks.batch_quota import TASK_INSTANCE_TAG, BatchQuotaShareHook
from airflow_quota_provider.operators.arguments import check_int
from airflow_quota_provider.protocol import MAX_NODES
from airflow_quota_provider.triggers.batch_service_job import BatchServiceJobTrigger

if TYPE_CHECKING:
    from sagemaker.train import ModelTrainer

    from airflow.sdk import Context

XCOM_JOB_ID = "service_job_id"
XCOM_PREEMPTIONS = "preempted_attempt_count"
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


def task_instance_key(ti: Any) -> str:
    """A stable key for one task instance: (dag_id, run_id, task_id, map_index), not the try number.

    Every try of the same task instance gets the same key, so a retry finds the job an earlier try
    submitted instead of submitting another one.
    """
    identity = json.dumps([ti.dag_id, ti.run_id, ti.task_id, getattr(ti, "map_index", -1)])
    return hashlib.sha256(identity.encode()).hexdigest()[:40]


def client_token(key: str, replaces_job_id: str | None = None) -> str:
    """SubmitServiceJob's clientToken (at most 64 characters): the task instance's key, or, when a
    retry resubmits after a FAILED job, one derived from that job so that it is new but still stable."""
    if replaces_job_id is None:
        return f"airflow-{key}"
    return f"airflow-{hashlib.sha256(f'{key}/{replaces_job_id}'.encode()).hexdigest()[:40]}"


def default_job_name(ti: Any, key: str) -> str:
    """``<dag_id>-<task_id>-<8 hex of the key>`` with characters Batch does not allow replaced by '-'."""
    base = _NOT_NAME.sub("-", f"{ti.dag_id}-{ti.task_id}")[:119]
    return f"{base}-{key[:8]}"


def _priority(value: Any, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {value!r} is not an integer between 0 and 9999") from None
    return BatchQuotaShareHook.check_priority(number, name)


def _preemption_retries(preemption_config: dict[str, Any] | None, retries: int | None) -> int | None:
    if preemption_config is None:
        return retries
    if retries is not None:
        raise ValueError("give preemption_config or preemption_retries_before_termination, not both")
    allowed = ("preemptionRetriesBeforeTermination", "preemption_retries_before_termination")
    unknown = sorted(set(preemption_config) - set(allowed))
    if unknown:
        raise ValueError(f"preemption_config: unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}")
    values = [preemption_config[k] for k in allowed if k in preemption_config]
    return values[0] if values else None


def _has_template(value: Any) -> bool:
    """Whether rendering may change ``value``: a Jinja string in it, or anything but JSON values (an XComArg)."""
    if isinstance(value, str):
        return any(mark in value for mark in ("{{", "{%", "{#"))
    if isinstance(value, dict):
        return any(_has_template(k) or _has_template(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_template(item) for item in value)
    return not (value is None or isinstance(value, bool | int | float))


def _request_object(training_job_request: dict[str, Any] | str) -> dict[str, Any]:
    request = training_job_request
    if isinstance(request, str):
        try:
            request = json.loads(request)
        except json.JSONDecodeError as error:
            raise ValueError(f"training_job_request: not a JSON object ({error})") from None
    if not isinstance(request, dict):
        raise ValueError(f"training_job_request: {request!r} is not a CreateTrainingJob request (a JSON object)")
    return request


def _sized_request(training_job_request: dict[str, Any] | str, nodes: int | None) -> dict[str, Any] | str:
    """The CreateTrainingJob request with ``ResourceConfig.InstanceCount`` set to ``nodes``.

    ``nodes`` None leaves the request as written. AWS Batch counts a job as InstanceCount units of its
    quota share, so a request that names another count, or sizes instance groups instead (a
    heterogeneous cluster), is refused rather than overridden. The request is not modified.
    """
    if nodes is None:
        return training_job_request
    request = _request_object(training_job_request)
    resources = request.get("ResourceConfig", {})
    if not isinstance(resources, dict):
        raise ValueError(f"training_job_request.ResourceConfig: {resources!r} is not an object")
    if "InstanceGroups" in resources:
        raise ValueError(
            f"nodes: {nodes} cannot size training_job_request's ResourceConfig.InstanceGroups (a heterogeneous "
            "cluster); set each group's InstanceCount there and leave nodes None"
        )
    count = resources.get("InstanceCount", nodes)
    if count != nodes:
        raise ValueError(
            f"nodes: {nodes} conflicts with training_job_request's ResourceConfig.InstanceCount {count!r}; "
            "set one of them"
        )
    return {**request, "ResourceConfig": {**resources, "InstanceCount": nodes}}


def _model_trainer_compute(model_trainer: Any) -> Any:
    """The ``Compute`` of a SageMaker SDK ``ModelTrainer`` (``sagemaker-train``), checked to be one that
    AWS Batch can queue: a SageMaker training job on one instance type."""
    try:
        from sagemaker.train.model_trainer import Mode, ModelTrainer
    except ImportError:
        raise ValueError(
            "model_trainer: needs the SageMaker Python SDK: pip install 'airflow-quota-provider[sagemaker]'"
        ) from None
    if not isinstance(model_trainer, ModelTrainer):
        raise ValueError(f"model_trainer: {type(model_trainer).__name__} is not a sagemaker.train ModelTrainer")
    if model_trainer.training_mode != Mode.SAGEMAKER_TRAINING_JOB:
        raise ValueError(
            f"model_trainer: training_mode {model_trainer.training_mode.name}; AWS Batch queues "
            "Mode.SAGEMAKER_TRAINING_JOB only"
        )
    compute = model_trainer.compute
    if compute is not None and compute.instance_groups:
        raise ValueError(
            "model_trainer: compute.instance_groups (a heterogeneous cluster) cannot be counted in one "
            "instance type of a quota share; give compute.instance_type and instance_count"
        )
    return compute


def model_trainer_request(model_trainer: ModelTrainer, inputs: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The CreateTrainingJob request of a ``ModelTrainer`` and its tags, as the SDK's
    ``TrainingQueue.submit`` builds them: the SDK resolves inputs, uploads source code and fills its
    defaults, and the request's ``Tags`` become the service job's."""
    request = model_trainer._create_training_job_args(input_data_config=inputs, boto3=True)
    tags = {tag["Key"]: tag["Value"] for tag in request.pop("Tags", None) or []}
    return request, tags


def share_fit_error(share: dict[str, Any], instance_type: str, count: int) -> str | None:
    """Why a job of ``count`` instances of ``instance_type`` could never start in quota ``share`` (as
    ListQuotaShares returns it), or None. AWS Batch counts a job as InstanceCount units of the share's
    capacity limit for its instance type; a job of a type no limit names, or of more units than the
    limit and its borrowLimit allow, waits RUNNABLE for ever."""
    spec = QuotaShareSpec.from_api(share)
    limits = dict(spec.capacity_limits)
    if instance_type not in limits:
        return (
            f"quota share {spec.name} has no capacity limit for {instance_type} (its limits: "
            f"{', '.join(limits) or 'none'}), so the job would never start"
        )
    capacity = limits[instance_type]
    if spec.borrow_limit == UNLIMITED_BORROW:
        return None
    ceiling = capacity + capacity * (spec.borrow_limit or 0) // 100
    if count > ceiling:
        borrowing = f" with borrowLimit {spec.borrow_limit}%" if spec.borrow_limit else ""
        return (
            f"{count} {instance_type} instances exceed quota share {spec.name}'s {capacity}{borrowing} "
            f"(at most {ceiling}), so the job would never start"
        )
    return None


class SageMakerBatchTrainingOperator(AwsBaseOperator[BatchQuotaShareHook]):
    """
    Queue a SageMaker training job on an AWS Batch job queue with shared quotas, and wait for it.

    The templated ``training_job_request`` (a SageMaker ``CreateTrainingJob`` request) is submitted as
    a ``SAGEMAKER_TRAINING`` service job. Batch starts it when its quota share has room, may preempt
    it for a higher-priority job (it goes back to RUNNABLE and each preemption is logged here and
    counted in XCom ``preempted_attempt_count``), and fails it once
    ``preemption_retries_before_termination`` is exhausted; the task then fails with the job's status
    reason.

    A retry of the task never submits a second job while the first is queued, running or done: every
    try derives the same key from (dag_id, run_id, task_id, map_index), tags the job with it and sends
    it as ``clientToken``, and looks for a job with that key before submitting. Only when the job of
    an earlier try FAILED does a retry submit a new one (with a new, still deterministic, token).

    :param job_queue: The Batch job queue (name or ARN), of type SAGEMAKER_TRAINING. (templated)
    :param training_job_request: The CreateTrainingJob request, as a dict or JSON string. (templated)
    :param model_trainer: Instead of ``training_job_request``: a SageMaker Python SDK ``ModelTrainer``
        (``sagemaker-train`` >= 1.7, extra ``airflow-quota-provider[sagemaker]``) in
        ``Mode.SAGEMAKER_TRAINING_JOB``. The SDK builds the request when the task runs, as its
        ``TrainingQueue.submit`` does (inputs, source code upload, the request's tags on the job); this
        operator submits it, so that the connection, ``clientToken`` and a priority of 0 hold, which
        ``TrainingQueue.submit`` does not. Its ``compute`` gives the instance type and count.
    :param inputs: The ModelTrainer's input channels (``TrainingQueue.submit``'s ``inputs``).
    :param nodes: The instances the training job runs on, 1 to ``MAX_NODES``: sets the request's
        ``ResourceConfig.InstanceCount``, which AWS Batch counts as that many units of the quota share.
        None (default) leaves the request's (or the ModelTrainer's ``compute.instance_count``) own. A
        request naming another InstanceCount is refused when the DAG is parsed, or, if it is templated,
        when it is rendered, before anything is submitted.
    :param job_name: The service job's name; default ``<dag_id>-<task_id>-<hash>``. (templated)
    :param quota_share_name: The quota share (the quota file's quota name). (templated) Before a job is
        submitted, a share whose capacity limits could never hold its instances (no limit for its
        instance type, or more instances than the limit and its borrowLimit) is refused.
    :param priority: ``schedulingPriority`` 0-9999, higher first (SageMaker SDK name; alias
        ``scheduling_priority``). (templated)
    :param preemption_config: ``{"preemptionRetriesBeforeTermination": N}`` (SageMaker SDK name); or
        give ``preemption_retries_before_termination=N``. Unset: requeued after every preemption.
    :param retry_strategy: Batch ``retryStrategy`` (``attempts`` 1-10, ``evaluateOnExit``). (templated)
    :param timeout_config: Batch ``timeoutConfig`` (``attemptDurationSeconds``). (templated)
    :param share_identifier: Fair-share identifier (queues with a fair-share policy only).
    :param tags: Tags of the service job. (templated)
    :param deferrable: Wait in the triggerer; default ``[operators] default_deferrable``.
    :param waiter_delay: Seconds between status checks.
    :param waiter_max_attempts: Status checks before giving up.
    """

    aws_hook_class = BatchQuotaShareHook
    template_fields: Sequence[str] = aws_template_fields(
        "job_queue",
        "training_job_request",
        "job_name",
        "quota_share_name",
        "priority",
        "retry_strategy",
        "timeout_config",
        "tags",
    )
    template_fields_renderers = {
        "training_job_request": "json",
        "retry_strategy": "json",
        "timeout_config": "json",
        "tags": "json",
    }
    ui_color = "#ff9900"

    def __init__(
        self,
        *,
        job_queue: str,
        training_job_request: dict[str, Any] | str | None = None,
        model_trainer: ModelTrainer | None = None,
        inputs: Any = None,
        nodes: int | None = None,
        job_name: str | None = None,
        quota_share_name: str | None = None,
        priority: int | str | None = None,
        scheduling_priority: int | str | None = None,
        preemption_config: dict[str, Any] | None = None,
        preemption_retries_before_termination: int | None = None,
        retry_strategy: dict[str, Any] | None = None,
        timeout_config: dict[str, Any] | None = None,
        share_identifier: str | None = None,
        tags: dict[str, str] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        waiter_delay: int = 30,
        waiter_max_attempts: int = 2880,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if priority is not None and scheduling_priority is not None:
            raise ValueError("give priority or scheduling_priority (the same thing), not both")
        if (training_job_request is None) == (model_trainer is None):
            raise ValueError("give one of training_job_request or model_trainer")
        if inputs is not None and model_trainer is None:
            raise ValueError("inputs: only with model_trainer; a training_job_request names its InputDataConfig")
        self.job_queue = job_queue
        self.nodes = check_int("nodes", nodes, minimum=1, maximum=MAX_NODES, allow_none=True)
        if model_trainer is not None:
            compute = _model_trainer_compute(model_trainer)
            count = compute.instance_count if compute is not None else None
            if self.nodes is not None and count is not None and count != self.nodes:
                raise ValueError(
                    f"nodes: {self.nodes} conflicts with model_trainer's compute.instance_count {count}; set one of them"
                )
        elif not _has_template(training_job_request):
            _sized_request(training_job_request, self.nodes)  # refused now, not when the task runs
        self.training_job_request = training_job_request
        self.model_trainer = model_trainer
        self.inputs = inputs
        self.job_name = job_name
        self.quota_share_name = quota_share_name
        self.priority = priority if priority is not None else scheduling_priority
        self.preemption_retries_before_termination = _preemption_retries(
            preemption_config, preemption_retries_before_termination
        )
        self.retry_strategy = retry_strategy
        self.timeout_config = timeout_config
        self.share_identifier = share_identifier
        self.tags = tags
        self.deferrable = deferrable
        self.waiter_delay = waiter_delay
        self.waiter_max_attempts = waiter_max_attempts
        self.job_id: str | None = None
        self._preemptions_logged = 0

    # ------------------------------------------------------------------ submit or reattach
    def execute(self, context: Context) -> str:
        ti = context["ti"]
        key = task_instance_key(ti)
        job_name = self.job_name or default_job_name(ti, key)
        if not _NAME.match(job_name):
            raise ValueError(
                f"job_name: {job_name!r} is not a valid service job name (letters, digits, '-' and '_', at most 128)"
            )
        earlier = self.hook.find_service_job(self.job_queue, job_name, key)
        if earlier is not None and earlier["status"] != BatchQuotaShareHook.FAILURE_STATE:
            self.job_id = earlier["jobId"]
            self.log.info(
                "Service job %s (%s) was submitted by an earlier try and is %s; waiting for it, not submitting again.",
                job_name,
                self.job_id,
                earlier["status"],
            )
        else:
            replaces = earlier["jobId"] if earlier is not None else None
            if replaces:
                self.log.info("The earlier try's service job %s FAILED (%s); submitting a new one.",
                              replaces, earlier.get("statusReason"))
            request, request_tags = self._request()
            self._check_share_fits(request)
            self.job_id = self._submit(request, request_tags, job_name, key, client_token(key, replaces), replaces)
        ti.xcom_push(key=XCOM_JOB_ID, value=self.job_id)

        description = self.hook.describe_service_job(self.job_id)
        self._observe(context, description)
        if description["status"] in BatchQuotaShareHook.TERMINAL_STATES:
            return self._finish(context, description)
        if self.deferrable:
            self.defer(
                trigger=BatchServiceJobTrigger(
                    job_id=self.job_id,
                    waiter_delay=self.waiter_delay,
                    waiter_max_attempts=self.waiter_max_attempts,
                    aws_conn_id=self.aws_conn_id,
                    region_name=self.region_name,
                    verify=self.verify,
                    botocore_config=self.botocore_config,
                ),
                method_name="execute_complete",
                timeout=self.execution_timeout,
            )
        return self._wait(context)

    def _request(self) -> tuple[dict[str, Any] | str, dict[str, str]]:
        """The CreateTrainingJob request to submit, sized by ``nodes``, and the tags it carries."""
        if self.model_trainer is None:
            return _sized_request(self.training_job_request, self.nodes), {}
        request, tags = model_trainer_request(self.model_trainer, self.inputs)
        return _sized_request(request, self.nodes), tags

    def _check_share_fits(self, request: dict[str, Any] | str) -> None:
        if not self.quota_share_name:
            return
        resources = _request_object(request).get("ResourceConfig") or {}
        if "InstanceType" not in resources:
            return  # instance groups: counted per group, by AWS
        shares = {share["quotaShareName"]: share for share in self.hook.list_quota_shares(self.job_queue)}
        if self.quota_share_name not in shares:
            return  # SubmitServiceJob names it in its refusal
        error = share_fit_error(
            shares[self.quota_share_name], resources["InstanceType"], resources.get("InstanceCount", 1)
        )
        if error:
            raise ValueError(f"quota_share_name: {error} in job queue {self.job_queue}")

    def _submit(
        self,
        request: dict[str, Any] | str,
        request_tags: dict[str, str],
        job_name: str,
        key: str,
        token: str,
        replaces: str | None,
    ) -> str:
        tags = {**(self.tags or {}), **request_tags, TASK_INSTANCE_TAG: key}
        try:
            response = self.hook.submit_service_job(
                job_name=job_name,
                job_queue=self.job_queue,
                training_job_request=request,
                quota_share_name=self.quota_share_name,
                scheduling_priority=_priority(self.priority, "priority"),
                preemption_retries_before_termination=self.preemption_retries_before_termination,
                retry_strategy=self.retry_strategy,
                timeout_config=self.timeout_config,
                share_identifier=self.share_identifier,
                tags=tags,
                client_token=token,
            )
        except ClientError as error:
            # The same clientToken may have been accepted already (a try that died between submit and
            # here): AWS rejects the repeat as a ClientException, whatever its message says. A job of
            # this task instance that the token created (not the FAILED one it replaces) shows it was
            # one; anything else (throttling past the retries, no access, another refusal) is raised.
            if error.response.get("Error", {}).get("Code") != BatchQuotaShareHook.CLIENT_ERROR_CODE:
                raise
            earlier = self.hook.find_service_job(self.job_queue, job_name, key)
            if earlier is None or earlier["jobId"] == replaces:
                raise
            self.log.info("Service job %s already submitted with this clientToken: %s", job_name, earlier["jobId"])
            return earlier["jobId"]
        self.log.info(
            "Submitted SageMaker training service job %s (%s) to %s, quota share %s, priority %s",
            job_name,
            response["jobId"],
            self.job_queue,
            self.quota_share_name,
            self.priority,
        )
        return response["jobId"]

    # ------------------------------------------------------------------ wait
    def _wait(self, context: Context) -> str:
        description: dict[str, Any] = {}
        for attempt in range(self.waiter_max_attempts):
            if attempt:
                time.sleep(self.waiter_delay)
            description = self.hook.describe_service_job(self.job_id)
            self._observe(context, description)
            if description["status"] in BatchQuotaShareHook.TERMINAL_STATES:
                return self._finish(context, description)
            self.log.info("Service job %s is %s", self.job_id, description["status"])
        raise AirflowException(
            f"Service job {self.job_id} is still {description.get('status')} after "
            f"{self.waiter_max_attempts} checks {self.waiter_delay}s apart"
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> str:
        event = validate_execute_complete_event(event)
        self.job_id = event["job_id"]
        description = self.hook.describe_service_job(self.job_id)
        self._observe(context, description)
        if description["status"] in BatchQuotaShareHook.TERMINAL_STATES:
            return self._finish(context, description)
        raise AirflowException(
            f"Service job {self.job_id} is {description['status']}: {event.get('message', 'waiting stopped')}"
        )

    def _observe(self, context: Context, description: dict[str, Any]) -> None:
        """Log each preemption not logged yet and keep the count in XCom."""
        count = BatchQuotaShareHook.preempted_attempt_count(description)
        if count <= self._preemptions_logged:
            return
        recent = (description.get("preemptionSummary") or {}).get("recentPreemptedAttempts") or []
        limit = self.preemption_retries_before_termination
        for number in range(self._preemptions_logged + 1, count + 1):
            # recentPreemptedAttempts holds the latest ones only; match them to their number from the end.
            index = len(recent) - (count - number) - 1
            reason = recent[index].get("statusReason") if 0 <= index < len(recent) else None
            self.log.warning(
                "Service job %s was preempted (preemption %d%s): %s",
                self.job_id,
                number,
                f" of at most {limit} retried" if limit is not None else "",
                reason or "no reason given",
            )
        self._preemptions_logged = count
        context["ti"].xcom_push(key=XCOM_PREEMPTIONS, value=count)

    def _finish(self, context: Context, description: dict[str, Any]) -> str:
        count = BatchQuotaShareHook.preempted_attempt_count(description)
        context["ti"].xcom_push(key=XCOM_PREEMPTIONS, value=count)
        if description["status"] == BatchQuotaShareHook.SUCCESS_STATE:
            self.log.info("Service job %s SUCCEEDED after %d preemption(s)", self.job_id, count)
            return self.job_id
        raise AirflowException(
            f"Service job {description.get('jobName')} ({self.job_id}) FAILED: "
            f"{description.get('statusReason') or 'no reason given'} (preempted {count} time(s))"
        )

    def on_kill(self) -> None:
        if not self.job_id:
            return
        self.hook.terminate_service_job(self.job_id, "Airflow task was killed")
        self.log.info("Terminated service job %s", self.job_id)


class UpdateServiceJobPriorityOperator(AwsBaseOperator[BatchQuotaShareHook]):
    """
    Change the scheduling priority of a queued or running service job (UpdateServiceJob).

    Like the SageMaker SDK's ``TrainingQueuedJob.update(scheduling_priority=...)``. A higher priority
    moves the job ahead in its quota share and lets it preempt lower-priority jobs there.

    :param job_id: The service job's ID, e.g.
        ``"{{ ti.xcom_pull(task_ids='train', key='service_job_id') }}"``. (templated)
    :param priority: The new ``schedulingPriority``, 0-9999 (alias ``scheduling_priority``). (templated)
    """

    aws_hook_class = BatchQuotaShareHook
    template_fields: Sequence[str] = aws_template_fields("job_id", "priority")
    ui_color = "#ff9900"

    def __init__(
        self,
        *,
        job_id: str,
        priority: int | str | None = None,
        scheduling_priority: int | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (priority is None) == (scheduling_priority is None):
            raise ValueError("give one of priority or scheduling_priority (the same thing)")
        self.job_id = job_id
        self.priority = priority if priority is not None else scheduling_priority

    def execute(self, context: Context) -> int:
        priority = _priority(self.priority, "priority")
        self.hook.update_service_job_priority(self.job_id, priority)
        self.log.info("Service job %s now has scheduling priority %d", self.job_id, priority)
        return priority
