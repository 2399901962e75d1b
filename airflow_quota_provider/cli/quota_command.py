"""Bodies of ``airflow quota status|jobs|set-priority|explain``: they call models/ and print."""

from __future__ import annotations

import functools
import getpass
import json
import sys
import time
from typing import Any, NoReturn

from sqlalchemy.exc import OperationalError, ProgrammingError

from airflow.utils.cli import suppress_logs_and_warning
from airflow.utils.session import create_session
from airflow_quota_provider.models.base import PRIORITY_MAX, PRIORITY_MIN
from airflow_quota_provider.models.job import (
    JobNotFound,
    JobState,
    QuotaJob,
    explain as explain_job,
    find_job,
    list_jobs,
    preemption_count,
    set_priority as set_job_priority,
    show_priority_on_task_instance,
)
from airflow_quota_provider.simulation.forecast import describe_start


def _needs_tables(command):
    """A database without the provider's tables is a set-up step missed, not a crash: say which."""

    @functools.wraps(command)
    def wrapper(args):
        try:
            return command(args)
        except (OperationalError, ProgrammingError) as e:
            raise SystemExit(
                f"Error: cannot read the quota tables ({e.orig}); run `airflow db migrate` "
                "(it creates them) and check AIRFLOW_HOME / [database] sql_alchemy_conn"
            )

    return wrapper


def _quota_file():
    from airflow_quota_provider.quota_file import QuotaFileUnavailable, configured_quota_file

    try:
        return configured_quota_file()
    except QuotaFileUnavailable as e:
        raise SystemExit(f"Error: {e}")


def _bad_input(error: Exception) -> NoReturn:
    """A bad argument: its error (naming the field and the values allowed) and exit code 2, as argparse's own."""
    print(f"Error: {error}", file=sys.stderr)
    raise SystemExit(2)


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    if not rows:
        print("(none)")
        return
    widths = {c: max(len(c), *(len(str(r.get(c, "") if r.get(c) is not None else "")) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c) if r.get(c) is not None else "").ljust(widths[c]) for c in columns))


def _emit(rows: Any, output: str, columns: list[str]) -> None:
    if output == "json":
        print(json.dumps(rows, indent=2, sort_keys=True, default=str))
    elif output == "csv":
        _print_csv(rows, columns)
    else:
        _print_table(rows, columns)


def _print_csv(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """The table's columns as CSV, each cell as a spreadsheet shows text (a DAG id is user-controlled)."""
    import csv

    from airflow_quota_provider.usage_report import csv_cell

    writer = csv.DictWriter(sys.stdout, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: csv_cell(row.get(c)) for c in columns} for row in rows)


@suppress_logs_and_warning
@_needs_tables
def status(args) -> None:
    """Per quota: capacity, in use, borrowed, lent, free, pending jobs and GPUs (from the policy); a
    typed job queue's quotas also per GPU type."""
    if getattr(args, "backend", "local") == "aws-batch":
        from airflow_quota_provider.cli import aws_command

        return aws_command.status(args)
    from airflow_quota_provider.usage import cohort_rows, queue_hosts, quota_rows

    quota_file = _quota_file()
    rows = []
    with create_session() as session:
        fleet = queue_hosts(session=session)
        for r in quota_rows(quota_file, session=session):
            row = {"queue": r.queue.name, "quota": r.quota.name, "sharing": r.quota.sharing}
            row.update({k: getattr(r.usage, k) for k in (
                "capacity", "in_use", "borrowed", "lent", "free", "pending_jobs", "pending_gpus")})
            hosts = fleet.get(r.queue.name)
            if r.types:
                row["types"] = [{"gpu_type": t.gpu_type, **{k: getattr(t.usage, k) for k in TYPE_FIGURES}}
                                for t in r.types]
                if fleet:
                    for t in row["types"]:
                        t["queue_gpus"] = hosts.gpus_up_by_type.get(t["gpu_type"], 0) if hosts else 0
            if fleet:
                row["queue_gpus"] = hosts.gpus_up if hosts else 0
                row["hosts_lost"] = ",".join(hosts.lost) if hosts else ""
            rows.append(row)
        cohorts = cohort_rows(quota_file, session=session)
    columns = ["queue", "quota", "sharing", "capacity", "in_use", "borrowed", "lent", "free", "pending_jobs",
               "pending_gpus"]
    if cohorts:
        rows = as_tree(quota_file, rows, cohorts, indent=args.output != "json")
        columns.insert(2, "cohort")
    if any(queue.types for queue in quota_file.queues):
        columns.insert(columns.index("sharing"), "gpu_type")
        if args.output != "json":
            rows = with_type_rows(rows)
    _emit(rows, args.output, columns + (["queue_gpus", "hosts_lost"] if fleet else []))


TYPE_FIGURES = ("capacity", "in_use", "borrowed", "lent", "free")
"""A typed job queue's figures of a quota per GPU type (``status``'s ``types``)."""


def with_type_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``status`` rows for a table or CSV: each quota (and cohort) of a typed job queue followed by one
    row per GPU type (its ``gpu_type`` named, the queue, quota and cohort repeated, ``queue_gpus`` the
    GPUs of that type's live hosts, no pending figures: a waiting job has no type until it is admitted)."""
    out = []
    for row in rows:
        types = row.pop("types", ())
        out.append(row)
        out.extend({**{k: row[k] for k in ("queue", "quota", "cohort") if k in row}, **t} for t in types)
    return out


def as_tree(quota_file, quota_rows: list[dict[str, Any]], cohorts: list, *, indent: bool) -> list[dict[str, Any]]:
    """``status`` rows of a file with cohorts in tree order: in each job queue, the quotas of the root,
    then each cohort (a row of its own: ``sharing`` is ``cohort``; a typed queue's with its ``types``)
    followed by its subtree. A quota's ``cohort`` is the cohort it is in, a cohort's its parent; with
    ``indent`` names are indented by depth."""
    from airflow_quota_provider.usage import cohort_figures

    by_quota = {(row["queue"], row["quota"]): row for row in quota_rows}
    by_cohort = {(row.queue.name, row.cohort.name): row for row in cohorts}
    result: list[dict[str, Any]] = []

    def level(queue, parent: str | None, depth: int) -> None:
        pad = "  " * depth if indent else ""
        for quota in queue.quotas:
            if quota.cohort == parent:
                result.append({**by_quota[(queue.name, quota.name)], "quota": pad + quota.name, "cohort": parent})
        for cohort in queue.cohorts:
            if cohort.parent == parent:
                row = by_cohort[(queue.name, cohort.name)]
                result.append({"queue": queue.name, "quota": pad + cohort.name, "cohort": parent, "sharing": "cohort",
                               **cohort_figures(row.usage)})
                if row.types:
                    result[-1]["types"] = [{"gpu_type": t.gpu_type, **cohort_figures(t.usage)} for t in row.types]
                level(queue, cohort.name, depth + 1)

    for queue in quota_file.queues:
        level(queue, None, 0)
    return result


@suppress_logs_and_warning
@_needs_tables
def hosts(args) -> None:
    """List the GPU hosts of the fleet: queues, GPUs, state, seconds since the last heartbeat, jobs."""
    import time

    from airflow_quota_provider.models.host import list_hosts

    from airflow_quota_provider.models.job import allocated_devices
    from airflow_quota_provider.usage import job_hosts

    now = time.time()
    with create_session() as session:
        jobs_on: dict[str, int] = {}  # a gang counts on each of its hosts
        for job in list_jobs(states=[JobState.RUNNING, JobState.STOPPING], session=session):
            for host in job_hosts(job):
                jobs_on[host] = jobs_on.get(host, 0) + 1
        in_use: dict[str, int] = {}
        for host, _ in allocated_devices(session=session):
            in_use[host] = in_use.get(host, 0) + 1
        rows = [
            {**h.to_dict(), "gpus": len(h.device_list), "in_use": in_use.get(h.name, 0),
             "heartbeat_age_s": round(now - h.heartbeat_at, 1), "jobs": jobs_on.get(h.name, 0)}
            for h in list_hosts(session=session)
        ]
    if args.output != "json":
        for row in rows:
            row["queues"], row["devices"] = ",".join(row["queues"]), ",".join(row["devices"])
    columns = ["name", "queues", "gpus", "in_use", "devices", "state", "heartbeat_age_s", "jobs"]
    if any(row["gpu_type"] for row in rows):
        columns.insert(2, "gpu_type")
    _emit(rows, args.output, columns)


@suppress_logs_and_warning
@_needs_tables
def jobs(args) -> None:
    """List active jobs (``--all``: every job), oldest first."""
    from airflow_quota_provider.usage import held_devices

    states = list(JobState) if args.all else None
    now = time.time()
    with create_session() as session:
        held = held_devices(session=session)
        rows = []
        for job in list_jobs(states=states, session=session):
            row = _job_row(job, held.get(job.id, {}), now)
            row["preemptions"] = preemption_count(job.dag_id, job.run_id, job.task_id, job.map_index, session=session)
            rows.append(row)
    columns = ["id", "dag_id", "task_id", "map_index", "run_id", "quota", "gpus", "nodes", "priority", "state",
               "hosts", "devices", "preemptions", "pending_position", "expected_start", "pending_reason"]
    if any(row["gpu_types"] or row["gpu_type"] for row in rows):
        columns[columns.index("gpus"):columns.index("gpus")] = ["gpu_types", "gpu_type"]
    if args.output != "json":
        rows = [_cells(row) for row in rows]
    _emit(rows, args.output, columns)


def _job_row(job: QuotaJob, held: dict[str, list[str]], now: float) -> dict[str, Any]:
    """A job as ``jobs`` prints it: ``to_dict`` with ``placement`` (per node, node 0 first: its host
    and the devices it holds there), ``devices`` (node 0's) and the pending reason people read."""
    from airflow_quota_provider.usage import job_nodes, pending_reason

    row = job.to_dict()
    nodes = job_nodes(job, held)
    row["placement"] = [{"host": n.host, "devices": n.devices} for n in nodes]
    row["devices"] = nodes[0].devices if nodes else []
    row["pending_reason"] = pending_reason(job, now)
    row["expected_start"] = _expected_start(row)
    return row


def _cells(row: dict[str, Any]) -> dict[str, Any]:
    """A job row's hosts and devices as a table or CSV cell shows them: "gpu-a,gpu-b (2 nodes)" and
    "gpu-a:0,1 gpu-b:0,1" for a gang; its host and "0,1" for a job on one host."""
    gang = row["nodes"] > 1
    hosts = ",".join(row["hosts"]) or ("-" if gang else "")
    devices = " ".join(f"{n['host']}:{','.join(n['devices'])}" for n in row["placement"])
    return {
        **row,
        "hosts": f"{hosts} ({row['nodes']} nodes)" if gang else hosts,
        "devices": devices if gang else ",".join(row["devices"]),
        "gpu_types": ",".join(row["gpu_types"]),
    }


def _expected_start(job: dict[str, Any]) -> str | None:
    """A waiting job's estimated start in words; None unless it waits."""
    if job["state"] != JobState.PENDING.value:
        return None
    return describe_start(job["estimated_start_at"], time.time())


@_needs_tables
def set_priority(args) -> None:
    """Change the priority of a task instance's active job."""
    if getattr(args, "backend", "local") == "aws-batch":
        from airflow_quota_provider.cli import aws_command

        return aws_command.set_priority(args)
    if not PRIORITY_MIN <= args.priority <= PRIORITY_MAX:
        raise SystemExit(f"Error: priority: {args.priority} is not an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    quota_file = _quota_file()
    with create_session() as session:
        try:
            job: QuotaJob = set_job_priority(
                args.dag_id, args.run_id, args.task_id, args.priority, map_index=args.map_index,
                quota_file=quota_file, by=f"{getpass.getuser()} (CLI)", session=session,
            )
        except (JobNotFound, ValueError) as e:
            raise SystemExit(f"Error: {e}")
        show_priority_on_task_instance(job, session=session)
        print(f"Priority of job {job.job_id} ({job.ti_label()}) set to {job.priority}")


@suppress_logs_and_warning
@_needs_tables
def explain(args) -> None:
    """Print a task's job: state, pending reason and position, devices, preemptions, events."""
    from airflow_quota_provider.usage import held_devices

    with create_session() as session:
        try:
            info = explain_job(args.dag_id, args.run_id, args.task_id, map_index=args.map_index, session=session)
            job = find_job(args.dag_id, args.run_id, args.task_id, map_index=args.map_index, session=session)
        except JobNotFound as e:
            raise SystemExit(f"Error: {e}")
        info.update(_job_row(job, held_devices(session=session).get(job.id, {}), time.time()))
    if args.output == "json":
        print(json.dumps(info, indent=2, sort_keys=True, default=str))
        return
    cells = _cells(info)
    per_node = f" ({info['nodes']} nodes x {info['gpus'] // info['nodes']})" if info["nodes"] > 1 else ""
    print(f"job {info['id']}: {info['dag_id']}.{info['task_id']} {info['run_id']} try {info['try_number']}")
    print(f"  quota {info['quota']}, {info['gpus']} GPUs{per_node}, priority {info['priority']}, state {info['state']}")
    if info["gpu_types"] or info["gpu_type"]:
        asked = f"asked {', '.join(info['gpu_types'])}" if info["gpu_types"] else "any type"
        print(f"  gpu type {info['gpu_type'] or '-'} ({asked})")
    if info["state"] == JobState.PENDING.value:
        print(f"  position {info['pending_position']}: {info['pending_reason']}")
        print(f"  {info['expected_start']}")
    if info["hosts"]:
        print(f"  {'hosts' if info['nodes'] > 1 else 'host'} {cells['hosts']}")
    if cells["devices"]:
        print(f"  devices {cells['devices']}")
    print(f"  preemptions {info['preemptions']}")
    if info["message"]:
        print(f"  {info['message']}")
    for e in info["events"]:
        extra = " ".join(f"{k}={e[k]}" for k in ("reason", "victim", "preemptor", "host", "devices") if e[k])
        print(f"  - {e['kind']} {extra} {e['message'] or ''}".rstrip())


@suppress_logs_and_warning
@_needs_tables
def usage(args) -> None:
    """GPU-seconds per quota, DAG or owner over --since/--until (the same figures as GET /quota/api/usage)."""
    import time

    from airflow_quota_provider.usage_report import UsageRequestError, columns, parse_time, usage_csv, usage_report

    quota_file = _quota_file()
    try:
        since = parse_time(args.since, "since")
        until = parse_time(args.until, "until") if args.until else time.time()
        with create_session() as session:
            rows = usage_report(quota_file, since, until, by=args.by, session=session)
    except UsageRequestError as e:
        _bad_input(e)
    if args.output == "csv":
        print(usage_csv(rows, args.by), end="")
        return
    _emit(rows, args.output, columns(args.by, rows))


@suppress_logs_and_warning
@_needs_tables
def db_clean(args) -> None:
    """Roll up usage by day, then delete audit events and finished jobs older than --older-than days."""
    from airflow_quota_provider.usage_report import UsageRequestError, db_clean as clean

    quota_file = _quota_file()
    try:
        with create_session() as session:
            result = clean(quota_file, args.older_than, session=session)
    except UsageRequestError as e:
        _bad_input(e)
    print(json.dumps(result, indent=2, sort_keys=True))
