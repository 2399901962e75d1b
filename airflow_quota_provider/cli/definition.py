"""The ``airflow quota`` command group: arguments here, thin command bodies in the command modules.

``status`` and ``set-priority`` take ``--backend local|aws-batch`` (local: QuotaExecutor's tables;
aws-batch: :mod:`.aws_command`); ``apply`` is AWS Batch only; ``simulate`` is
:mod:`.simulate_command`'s.
"""

from __future__ import annotations

from airflow.cli.cli_config import ARG_VERBOSE, ActionCommand, Arg, GroupCommand, lazy_load_command

from airflow_quota_provider.cli.aws_command import (
    APPLY_ARGS,
    ARG_AWS_CONN_ID,
    ARG_BACKEND,
    ARG_JOB_ID,
    ARG_JOB_QUEUE,
    ARG_REGION,
)
from airflow_quota_provider.cli.simulate_command import SIMULATE_COMMAND
from airflow_quota_provider.cli.worker_command import WORKER_COMMAND

ARG_OUTPUT = Arg(
    ("-o", "--output"),
    help="Output format: table (default) or json",
    choices=("table", "json"),
    default="table",
)
ARG_USAGE_OUTPUT = Arg(
    ("-o", "--output"),
    help="Output format: table (default), json or csv",
    choices=("table", "json", "csv"),
    default="table",
)
ARG_SINCE = Arg(("--since",), help="Start of the period (inclusive): ISO 8601 (UTC unless a zone is given) or POSIX seconds", required=True)
ARG_UNTIL = Arg(("--until",), help="End of the period (exclusive); default: now")
ARG_BY = Arg(("--by",), help="Charge GPU-seconds per quota (default), dag or owner", choices=("quota", "dag", "owner"), default="quota")
ARG_OLDER_THAN = Arg(("--older-than",), help="Delete audit events and finished jobs older than DAYS days (whole UTC days), after rolling them up", type=float, required=True, metavar="DAYS")
ARG_ALL = Arg(("--all",), help="Also list finished and failed jobs", action="store_true")
ARG_DAG_ID = Arg(("dag_id",), help="The DAG id")
ARG_RUN_ID = Arg(("run_id",), help="The DAG run id")
ARG_TASK_ID = Arg(("task_id",), help="The task id")
ARG_PRIORITY = Arg(("priority",), help="The new priority (integer, higher runs first)", type=int)
ARG_MAP_INDEX = Arg(("--map-index",), help="Map index of a mapped task instance", type=int, default=-1)
_AWS = (ARG_BACKEND, ARG_JOB_QUEUE, ARG_AWS_CONN_ID, ARG_REGION)

QUOTA_COMMANDS: list[ActionCommand] = [
    ActionCommand(
        name="status",
        help="Per job queue and quota: capacity, GPUs in use, borrowed, lent, free, waiting jobs",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.status"),
        args=(ARG_OUTPUT, ARG_VERBOSE, *_AWS),
    ),
    ActionCommand(
        name="jobs",
        help="List jobs with their state, devices, priority and pending reason",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.jobs"),
        args=(ARG_OUTPUT, ARG_ALL, ARG_VERBOSE),
    ),
    ActionCommand(
        name="hosts",
        help="List the GPU hosts of the fleet: job queues, GPUs, state (active or lost), last heartbeat, jobs",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.hosts"),
        args=(ARG_OUTPUT, ARG_VERBOSE),
    ),
    WORKER_COMMAND,
    ActionCommand(
        name="set-priority",
        help="Change the priority of a waiting or running task; the next scheduling cycle uses it",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.set_priority"),
        args=(ARG_DAG_ID, ARG_RUN_ID, ARG_TASK_ID, ARG_PRIORITY, ARG_MAP_INDEX, ARG_VERBOSE, *_AWS, ARG_JOB_ID),
    ),
    ActionCommand(
        name="explain",
        help="Why a task waits: its pending reason, position in its quota's queue, and history",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.explain"),
        args=(ARG_DAG_ID, ARG_RUN_ID, ARG_TASK_ID, ARG_MAP_INDEX, ARG_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="apply",
        help="Make an AWS Batch job queue's quota shares match one queue of a quota file (--backend aws-batch)",
        func=lazy_load_command("airflow_quota_provider.cli.aws_command.apply"),
        args=APPLY_ARGS,
    ),
    ActionCommand(
        name="usage",
        help="GPU-seconds used within capacity, borrowed, lent, idle and lost to preemption, per quota, DAG or owner "
             "(and GPU type), with their cost where the quota file has a gpu_hour_price",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.usage"),
        args=(ARG_SINCE, ARG_UNTIL, ARG_BY, ARG_USAGE_OUTPUT, ARG_VERBOSE),
    ),
    ActionCommand(
        name="db-clean",
        help="Roll up usage by day, then delete old audit events and finished jobs (totals survive)",
        func=lazy_load_command("airflow_quota_provider.cli.quota_command.db_clean"),
        args=(ARG_OLDER_THAN, ARG_VERBOSE),
    ),
    SIMULATE_COMMAND,
]


def get_quota_cli_commands() -> list[GroupCommand]:
    """The ``cli`` entry of get_provider_info."""
    return [
        GroupCommand(
            name="quota",
            help="Shared GPU quotas: status, jobs, priorities and pending reasons",
            subcommands=QUOTA_COMMANDS,
        )
    ]
