"""Chargeback: GPU-seconds per quota, DAG or DAG owner over a period, for the CLI, REST API and UI.

The imperative shell around :mod:`airflow_quota_provider.policy.accounting`: it reads the audit log
(and, for days ``db-clean`` pruned, the daily roll-up) and Airflow's DAG owners; the figures
themselves are the core's. ``airflow quota usage`` and ``GET /quota/api/usage`` both call
:func:`usage_report`, so they show the same numbers.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_quota_provider.models import usage as ledger
from airflow_quota_provider.policy.accounting import DAY_S, KINDS, Account, costs, period_cuts, totals

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from airflow_quota_provider.policy import QuotaFile

BY = ("quota", "dag", "owner")
MAX_BUCKETS = 1440
"""The most buckets one series request may ask for (a day in one-minute buckets)."""
TIME_MIN, TIME_MAX = 0.0, 253402300799.0
"""The times a request may name: 1970-01-01T00:00:00Z to 9999-12-31T23:59:59Z, in POSIX seconds."""
MAX_DAYS = 3660
"""The longest period one report covers, in days (ten years): a report is one account period per
UTC day, so this bounds its work and memory whatever ``since`` and ``until`` a caller sends."""
MAX_OLDER_THAN_DAYS = 36500
"""The largest ``db-clean --older-than`` (a hundred years)."""


class UsageRequestError(ValueError):
    """A bad request; the message names the field (``since``, ``until``, ``by``, ``every``, ``older-than``)
    and the values allowed. The one home of these checks: the CLI and the REST API both call here."""


def parse_time(value: str, field: str) -> float:
    """An ISO 8601 time (UTC when it names no zone) or POSIX seconds, as POSIX seconds, from
    :data:`TIME_MIN` to :data:`TIME_MAX` (NaN, infinities and times outside are refused)."""
    try:
        at = float(value)
    except ValueError:
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise UsageRequestError(
                f"{field}: {value!r} is not an ISO 8601 time (2026-01-31T00:00:00Z) or POSIX seconds"
            ) from None
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        try:
            at = moment.timestamp()
        except (OverflowError, ValueError):  # year 1 east of UTC, year 9999 west of it
            at = float("nan")
    if not TIME_MIN <= at <= TIME_MAX:  # NaN compares false too
        raise UsageRequestError(f"{field}: {value!r} is not a time from {iso(TIME_MIN)} to {iso(TIME_MAX)}")
    return at


def report_span(since: float, until: float, *, session: Session) -> tuple[float, float]:
    """The span a report over [since, until) covers: from the install's start at the earliest, as
    nothing is charged before it (``since=0`` asks for everything there is), and empty when it all
    lies before. An empty or reversed request, or a span over :data:`MAX_DAYS` days (one account
    period per day), is refused naming ``until``."""
    if not until > since:
        raise UsageRequestError(f"until: {iso(until)} is not after since {iso(since)}")
    start = ledger.install_start(session=session)
    since = min(until, max(since, until if start is None else start))
    if until - since > MAX_DAYS * DAY_S:
        raise UsageRequestError(
            f"until: {iso(until)} is {(until - since) / DAY_S:.0f} days after {iso(since)} (since, or the install's "
            f"start if later); a report covers at most {MAX_DAYS} days (one period per day)"
        )
    return since, until


def iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat().replace("+00:00", "Z")


def account_period(
    quota_file: QuotaFile, since: float, until: float, *, every_s: float = DAY_S, session: Session
) -> Account:
    """The account of :func:`report_span`'s [since, until) cut at the multiples of ``every_s`` (a
    divisor of a day, so UTC midnights are always cuts): rolled-up days from the roll-up (whole days),
    the rest from the audit log. A bound inside a rolled-up day is refused (its events are gone)."""
    merged = Account([], {}, {}, {})
    if since == until:  # all before the install's start
        return merged
    rolled = ledger.rolled_until(session=session) or float("-inf")
    for name, at in (("since", since), ("until", until)):
        if at < rolled and at % DAY_S:
            raise UsageRequestError(
                f"{name}: {iso(at)} falls in a day already rolled up (before {iso(rolled)}); use a UTC midnight"
            )
    parts = []
    if since < rolled:
        parts.append(ledger.read_rollup(since, min(until, rolled), session=session))
    if until > rolled:
        periods = period_cuts(max(since, rolled), until, every_s)
        parts.append(ledger.account_log(quota_file, periods, session=session).account)
    for part in parts:
        merged.periods += part.periods
        merged.quotas.update(part.quotas)
        merged.dags.update(part.dags)
        merged.pools.update(part.pools)
        merged.quota_types.update(part.quota_types)
        merged.dag_types.update(part.dag_types)
    return merged


def dag_owners(*, session: Session) -> dict[str, str]:
    """DAG id -> its owners as Airflow's DAG table lists them (empty where there is no such table)."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    try:
        from airflow.models.dag import DagModel

        return {dag_id: owners or "unknown" for dag_id, owners in session.execute(select(DagModel.dag_id, DagModel.owners))}
    except (ImportError, SQLAlchemyError):
        return {}


def usage_report(
    quota_file: QuotaFile,
    since: float,
    until: float,
    *,
    by: str = "quota",
    session: Session,
    owners: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One row per quota, DAG or owner: GPU-seconds of each kind over [since, until).

    Quota rows carry ``capacity_s``, ``lent`` and ``idle`` (used_within + lent + idle = capacity_s);
    DAG and owner rows only what their jobs held (``used_within``, ``borrowed``, ``lost``). Where a
    job queue has GPU types, every row carries ``gpu_type`` and there is one row per name and type
    (None: an untyped queue's); where the quota file prices GPU-hours (``gpu_hour_price``), every row
    carries ``cost``: its used_within + borrowed GPU-hours at the price of each quota and type, in
    the current quota file (None where some of them has no price).
    """
    if by not in BY:
        raise UsageRequestError(f"by: {by!r} is not one of {', '.join(BY)}")
    since, until = report_span(since, until, session=session)
    result = account_period(quota_file, since, until, session=session)
    if by == "owner" and owners is None:
        owners = dag_owners(session=session)
    return _rows(result, by, owners, since, until, prices(quota_file))


def usage_series(
    quota_file: QuotaFile, since: float, until: float, every_s: float, *, session: Session
) -> list[dict[str, Any]]:
    """[since, until) in buckets cut at the multiples of ``every_s`` (a divisor of a day; a rolled-up
    day is one bucket): per bucket ``since``, ``until`` and :func:`usage_report`'s quota rows. The
    buckets' rows add up to the report's over the same span (one account, cut finer)."""
    if not (every_s >= 60 and DAY_S % every_s == 0):
        raise UsageRequestError(f"every: {every_s:g} is not a whole divisor of a day (86400) of at least 60 seconds")
    since, until = report_span(since, until, session=session)
    if (until - since) / every_s > MAX_BUCKETS:
        raise UsageRequestError(f"every: {every_s:g} s cuts the period into more than {MAX_BUCKETS} buckets")
    result = account_period(quota_file, since, until, every_s=every_s, session=session)
    series = []
    priced = prices(quota_file)
    for start, end in result.periods:
        bucket = Account([(start, end)], {k: f for k, f in result.quotas.items() if k[0] == start}, {}, {},
                         quota_types={k: f for k, f in result.quota_types.items() if k[0] == start})
        series.append({"since": iso(start), "until": iso(end), "rows": _rows(bucket, "quota", None, start, end, priced)})
    return series


def prices(quota_file: QuotaFile) -> dict[tuple[str, str | None], float]:
    """(quota, GPU type) -> the price of one GPU-hour there (the type None in an untyped job queue)."""
    return {(quota.name, gpu_type): price for queue in quota_file.queues
            for gpu_type, price in queue.gpu_hour_price.items() for quota in queue.quotas}


def _rows(
    result: Account, by: str, owners: dict[str, str] | None, since: float, until: float,
    priced: dict[tuple[str, str | None], float],
) -> list[dict[str, Any]]:
    per_type = any(key[2] is not None for key in result.quota_types) or any(key[2] is not None for key in result.dag_types)
    cost = costs(result, priced, by=by, owners=owners, per_type=per_type) if priced else {}
    rows = []
    for key, figures in sorted(totals(result, by=by, owners=owners, per_type=per_type).items(), key=_sort_key):
        row: dict[str, Any] = {by: key[0], "gpu_type": key[1]} if per_type else {by: key}
        row.update(since=iso(since), until=iso(until))
        if by == "quota":
            row["capacity_s"] = round(figures.capacity_s, 3)
        for kind in KINDS:
            if by == "quota" or kind not in ("lent", "idle"):
                row[kind] = round(getattr(figures, kind), 3)
        if priced:
            row["cost"] = None if cost.get(key) is None else round(cost[key], 4)
        rows.append(row)
    return rows


def _sort_key(item: tuple[Any, Any]) -> Any:
    key = item[0]
    return (key[0], key[1] or "") if isinstance(key, tuple) else key


def columns(by: str, rows: Sequence[dict[str, Any]] = ()) -> list[str]:
    """The columns of :func:`usage_report`'s ``rows``, in table and CSV order: ``gpu_type`` after the
    name where the rows are per GPU type, ``cost`` last where the quota file prices GPU-hours."""
    kinds = ["capacity_s", *KINDS] if by == "quota" else [k for k in KINDS if k not in ("lent", "idle")]
    typed = ["gpu_type"] if any("gpu_type" in row for row in rows) else []
    cost = ["cost"] if any("cost" in row for row in rows) else []
    return [by, *typed, *kinds, *cost]


def usage_csv(rows: list[dict[str, Any]], by: str) -> str:
    """The rows as CSV (``airflow quota usage -o csv``, ``GET /quota/api/usage?format=csv``)."""
    import csv
    import io

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*columns(by, rows), "since", "until"], lineterminator="\n")
    writer.writeheader()
    writer.writerows({key: csv_cell(value) for key, value in row.items()} for row in rows)
    return out.getvalue()


CSV_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")
"""What a spreadsheet reads as the start of a formula (OWASP, CSV injection)."""


def csv_cell(value: Any) -> Any:
    """A CSV cell a spreadsheet shows as text: a string starting like a formula gets a ``'`` before
    it (a DAG id or owner is user-controlled). Numbers stay numbers, negative ones too: they are
    ours, never a user's text, and a spreadsheet must add them up."""
    return "'" + value if isinstance(value, str) and value.startswith(CSV_FORMULA_START) else value


def db_clean(quota_file: QuotaFile, older_than_days: float, *, session: Session, now: float | None = None) -> dict[str, Any]:
    """Roll up every whole UTC day before the horizon (midnight ``older_than_days`` ago) that is not
    rolled up yet, then delete the events and finished jobs before it; the caller commits."""
    if not 0 <= older_than_days <= MAX_OLDER_THAN_DAYS:  # NaN compares false too
        raise UsageRequestError(f"older-than: {older_than_days} is not a number of days from 0 to {MAX_OLDER_THAN_DAYS}")
    now = time.time() if now is None else now
    horizon = (now - older_than_days * DAY_S) // DAY_S * DAY_S
    start = ledger.rolled_until(session=session)
    if start is None:
        first = ledger.first_event_at(session=session)
        start = None if first is None else first // DAY_S * DAY_S
    days = 0
    if start is not None and start < horizon:
        periods = period_cuts(start, horizon, DAY_S)
        logged = ledger.account_log(quota_file, periods, session=session)
        queue_of = {q.name: queue.name for _, queues in logged.configs for queue in queues for q in queue.quotas}
        ledger.store_rollup(logged.account, queue_of, session=session)
        days = len(periods)
    jobs, events = ledger.delete_before(horizon, session=session)
    return {"horizon": iso(horizon), "days_rolled_up": days, "jobs_deleted": jobs, "events_deleted": events}
