"""``airflow quota ... --backend aws-batch``: the quota file on AWS Batch shared quotas.

Thin command bodies over :class:`~airflow_quota_provider.hooks.batch_quota.BatchQuotaShareHook`,
each a plain function of the parsed arguments, with the arguments each needs as ``Arg`` tuples:

* ``apply``: ``airflow quota apply --backend aws-batch --job-queue QUEUE [--dry-run] QUOTAS.yaml``
  prints the plan, then (unless ``--dry-run``) makes AWS match it; a second run changes nothing.
* ``status``: ``airflow quota status --backend aws-batch --job-queue QUEUE``: per quota share, its
  capacity, use, borrowing and waiting/running jobs (GetJobQueueSnapshot + ListServiceJobs).
* ``set_priority``: ``airflow quota set-priority --backend aws-batch --job-queue QUEUE
  DAG_ID RUN_ID TASK_ID PRIORITY [--map-index N]`` (or ``--job-id ID``) updates a service job's
  schedulingPriority.

Errors end in ``SystemExit("Error: ...")`` naming the field and, where there is a closed set, the
allowed values; no traceback for bad input or an AWS refusal.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from airflow.cli.cli_config import ARG_VERBOSE, Arg
from airflow.utils.cli import suppress_logs_and_warning

BACKENDS = ("local", "aws-batch")

ARG_BACKEND = Arg(
    ("--backend",),
    help="Where the quotas live: local (QuotaExecutor, default) or aws-batch (AWS Batch quota shares)",
    choices=BACKENDS,
    default="local",
)
ARG_JOB_QUEUE = Arg(("--job-queue",), help="AWS Batch job queue (name or ARN) of type SAGEMAKER_TRAINING")
ARG_QUEUE = Arg(
    ("--queue",),
    help="Queue of the quota file to apply (default: its only queue, or the one named like --job-queue)",
)
ARG_DRY_RUN = Arg(("--dry-run",), help="Show the plan and change nothing", action="store_true")
ARG_QUOTA_FILE_PATH = Arg(("quota_file",), help="The quota file (YAML)", metavar="QUOTAS.yaml")
ARG_AWS_CONN_ID = Arg(("--aws-conn-id",), help="Airflow connection for AWS (default aws_default)", default="aws_default")
ARG_REGION = Arg(("--region",), help="AWS region (default: the connection's)")
ARG_JOB_ID = Arg(("--job-id",), help="AWS Batch service job ID (instead of DAG_ID RUN_ID TASK_ID)")
ARG_OUTPUT = Arg(("-o", "--output"), help="Output format: table (default) or json", choices=("table", "json"),
                 default="table")
ARG_DAG_ID = Arg(("dag_id",), help="The DAG id")
ARG_RUN_ID = Arg(("run_id",), help="The DAG run id")
ARG_TASK_ID = Arg(("task_id",), help="The task id")
ARG_PRIORITY = Arg(("priority",), help="The new priority, 0-9999 on AWS Batch (higher runs first)", type=int)
ARG_MAP_INDEX = Arg(("--map-index",), help="Map index of a mapped task instance", type=int, default=-1)

_AWS = (ARG_BACKEND, ARG_JOB_QUEUE, ARG_AWS_CONN_ID, ARG_REGION, ARG_VERBOSE)
APPLY_ARGS = (*_AWS, ARG_QUEUE, ARG_DRY_RUN, ARG_OUTPUT, ARG_QUOTA_FILE_PATH)
STATUS_ARGS = (*_AWS, ARG_OUTPUT)
SET_PRIORITY_ARGS = (*_AWS, ARG_JOB_ID, ARG_MAP_INDEX, ARG_DAG_ID, ARG_RUN_ID, ARG_TASK_ID, ARG_PRIORITY)
"""For a standalone parser; the ``airflow quota set-priority`` command reuses its own positionals."""


def add_arguments(parser: Any, args: tuple[Arg, ...]) -> Any:
    """Add ``args`` to a plain ``argparse`` parser (as Airflow does for its commands)."""
    for arg in args:
        arg.add_to_parser(parser)
    return parser


def _hook(args: Any):
    from airflow_quota_provider.hooks.batch_quota import BatchQuotaShareHook

    if not getattr(args, "job_queue", None):
        raise SystemExit("Error: --job-queue: required with --backend aws-batch")
    return BatchQuotaShareHook(aws_conn_id=getattr(args, "aws_conn_id", "aws_default"),
                               region_name=getattr(args, "region", None))


def _aws_errors():
    """Turn AWS and configuration refusals into ``Error: ...`` exits (no traceback)."""
    from contextlib import contextmanager

    from botocore.exceptions import BotoCoreError, ClientError

    from airflow_quota_provider.policy import PolicyError

    @contextmanager
    def guard():
        try:
            yield
        except PolicyError as error:
            raise SystemExit(f"Error: {error}") from None
        except ClientError as error:
            info = error.response.get("Error", {})
            raise SystemExit(
                f"Error: AWS Batch {error.operation_name}: {info.get('Code')}: {info.get('Message')}"
            ) from None
        except BotoCoreError as error:
            raise SystemExit(f"Error: AWS: {error}") from None
        except ValueError as error:
            raise SystemExit(f"Error: {error}") from None

    return guard()


def _select_queue(quota_file: Any, wanted: str | None, job_queue: str, path: str) -> tuple[Any, str]:
    names = [queue.name for queue in quota_file.queues]
    if wanted is None:
        if len(names) == 1:
            wanted = names[0]
        elif job_queue in names:
            wanted = job_queue
        else:
            raise SystemExit(
                f"Error: --queue: {path} has several queues and none is named {job_queue!r}; "
                f"choose one of {', '.join(names)}"
            )
    if wanted not in names:
        raise SystemExit(f"Error: --queue: {wanted!r} is not one of {', '.join(names)}")
    index = names.index(wanted)
    return quota_file.queues[index], f"queues[{index}]"


@suppress_logs_and_warning
def apply(args: Any) -> None:
    """Plan, print, and (unless --dry-run) apply one queue of a quota file to an AWS Batch job queue."""
    from airflow_quota_provider.policy import PolicyError, load_quota_file

    if getattr(args, "backend", "aws-batch") != "aws-batch":
        raise SystemExit(
            "Error: --backend: apply needs aws-batch; the local executor reads the quota file named by "
            "[quota] quota_file itself"
        )
    try:
        quota_file = load_quota_file(args.quota_file)
    except PolicyError as error:
        raise SystemExit(f"Error: {args.quota_file}: {error}") from None
    except OSError as error:
        raise SystemExit(f"Error: {args.quota_file}: cannot read: {error.strerror}") from None
    hook = _hook(args)
    queue, path = _select_queue(quota_file, getattr(args, "queue", None), args.job_queue, args.quota_file)
    with _aws_errors():
        plan = hook.plan_quota_shares(args.job_queue, queue, path=path)
    dry_run = bool(getattr(args, "dry_run", False))
    if getattr(args, "output", "table") == "json":
        out = plan.to_dict()
        out["dry_run"] = dry_run
        if not dry_run:
            with _aws_errors():
                out["applied"] = len(hook.apply_plan(plan))
        print(json.dumps(out, indent=2))
        return
    print(plan.render())
    if plan.empty:
        return
    if dry_run:
        print("Dry run: nothing changed.")
        return
    with _aws_errors():
        done = hook.apply_plan(plan)
    print(f"Applied {len(done)} change(s) to job queue {args.job_queue}.")


STATUS_COLUMNS = ["quota_share", "state", "strategy", "capacity", "unit", "in_use", "borrowed",
                  "running_jobs", "runnable_jobs"]


@suppress_logs_and_warning
def status(args: Any) -> None:
    """Per-share usage of an AWS Batch job queue."""
    hook = _hook(args)
    with _aws_errors():
        hook.check_job_queue(args.job_queue)
        rows = hook.quota_share_usage(args.job_queue)
    if getattr(args, "output", "table") == "json":
        print(json.dumps({"job_queue": args.job_queue, "quota_shares": rows}, indent=2))
        return
    print(f"AWS Batch job queue {args.job_queue}")
    _print_table(rows, STATUS_COLUMNS)


@suppress_logs_and_warning
def set_priority(args: Any) -> None:
    """UpdateServiceJob's schedulingPriority for the job of a task instance (or --job-id)."""
    hook = _hook(args)
    with _aws_errors():
        priority = hook.check_priority(args.priority)
        job_id = getattr(args, "job_id", None) or _job_of_task_instance(hook, args)
        hook.update_service_job_priority(job_id, priority)
    print(f"Service job {job_id}: schedulingPriority {priority}")


def _job_of_task_instance(hook: Any, args: Any) -> str:
    """The newest service job that SageMakerBatchTrainingOperator submitted for this task instance."""
    from airflow_quota_provider.operators.batch_training import default_job_name, task_instance_key

    for name in ("dag_id", "run_id", "task_id"):
        if not getattr(args, name, None):
            raise SystemExit(f"Error: {name}: required unless --job-id is given")
    ti = _TaskInstanceId(args.dag_id, args.run_id, args.task_id, getattr(args, "map_index", -1))
    key = task_instance_key(ti)
    job = hook.find_service_job(args.job_queue, default_job_name(ti, key), key)
    if job is None:
        job = _scan_unfinished(hook, args.job_queue, key)
    if job is None:
        raise SystemExit(
            f"Error: no service job of {args.dag_id} / {args.run_id} / {args.task_id} (map index {ti.map_index}) "
            f"in job queue {args.job_queue}; give --job-id"
        )
    return job["jobId"]


def _scan_unfinished(hook: Any, job_queue: str, key: str) -> dict[str, Any] | None:
    """A job with a custom job_name: look through the unfinished ones for the task instance's tag."""
    from airflow_quota_provider.hooks.batch_quota import TASK_INSTANCE_TAG

    for state in hook.INTERMEDIATE_STATES:
        for summary in hook.list_service_jobs(job_queue, job_status=state):
            detail = hook.describe_service_job(summary["jobId"])
            if (detail.get("tags") or {}).get(TASK_INSTANCE_TAG) == key:
                return detail
    return None


class _TaskInstanceId:
    def __init__(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> None:
        self.dag_id, self.run_id, self.task_id, self.map_index = dag_id, run_id, task_id, map_index


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:g}"
        return "" if value is None else str(value)

    table = [columns] + [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(columns))]
    for line in table:
        sys.stdout.write("  ".join(text.ljust(width) for text, width in zip(line, widths)).rstrip() + "\n")
    if not rows:
        sys.stdout.write("(no quota shares)\n")
