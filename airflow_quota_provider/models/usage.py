"""The daily usage roll-up: the accounting of days whose audit events ``airflow quota db-clean`` deleted.

Rows are what :func:`airflow_quota_provider.policy.accounting.account` computed for one UTC day, so a
report over rolled-up days reads these instead of the events, and totals survive pruning.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, NamedTuple

from sqlalchemy import Float, String, delete, func, or_, select
from sqlalchemy.orm import Mapped, mapped_column

from airflow_quota_provider.models.base import QuotaBase
from airflow_quota_provider.models.job import EventKind, JobState, QuotaEvent, QuotaJob
from airflow_quota_provider.policy.accounting import (
    DAY_S,
    EVENT_KINDS,
    Account,
    Config,
    Event,
    Figures,
    Hold,
    PoolFigures,
    account_history,
    holds_from_events,
)
from airflow_quota_provider.policy.config import parse_quota_file

if TYPE_CHECKING:
    from collections.abc import Sequence

    from sqlalchemy.orm import Session

    from airflow_quota_provider.policy import QuotaFile

QUOTA, DAG, POOL = "quota", "dag", "pool"
"""``quota_usage_daily.scope``: a quota's figures, one DAG's share of a quota's, a job queue's pool."""


class QuotaUsageDaily(QuotaBase):
    """One UTC day's GPU-seconds of a quota, of a DAG on a quota, or of a job queue's pool."""

    __tablename__ = "quota_usage_daily"

    day: Mapped[float] = mapped_column(Float, primary_key=True)
    """The day's start, POSIX seconds (a UTC midnight)."""
    scope: Mapped[str] = mapped_column(String(8), primary_key=True)
    queue: Mapped[str] = mapped_column(String(128), primary_key=True)
    quota: Mapped[str] = mapped_column(String(128), primary_key=True)
    """Empty for a pool row."""
    dag_id: Mapped[str] = mapped_column(String(250), primary_key=True)
    """Empty for quota and pool rows; ``-`` for holds without a DAG."""
    gpu_type: Mapped[str] = mapped_column(String(64), primary_key=True, default="", server_default="")
    """Quota and DAG rows: the GPU type the figures are of (a quota's are per type in a job queue
    with GPU types); empty where untyped, and for pool rows (summed over the types)."""
    capacity_s: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    used_within: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    borrowed: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    lent: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    idle: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    lost: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    drawn: Mapped[float] = mapped_column(Float, nullable=False, default=0.0)
    """Pool rows: what borrowers held of the pool."""


_KINDS = ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost")
_EVENT_COLUMNS = (QuotaEvent.at, QuotaEvent.kind, QuotaEvent.job_id, QuotaEvent.quota, QuotaEvent.dag_id,
                  QuotaEvent.devices, QuotaEvent.checkpoint_at, QuotaEvent.gpu_type)
"""What accounting reads of an event, in :class:`~airflow_quota_provider.policy.accounting.Event`'s order."""


def accounting_events(since: float, until: float, *, session: Session) -> list[Event]:
    """The audit events that describe holds overlapping [since, until), oldest first: the window's,
    the earlier ones of jobs with an event since ``since`` (a hold open across ``since``), and the
    later ones of jobs not settled by ``until``: how a hold open across ``until`` ends decides
    whether its work before ``until`` was lost, so that a period's figures do not depend on when it
    is reported and adjacent periods add up to their union."""
    events = _events_before(since, until, session=session)
    last: dict[str, str] = {}
    for event in events:
        if event.job is not None:
            last[event.job] = event.kind
    unsettled = [int(job) for job, kind in last.items() if kind not in ("stopped", "finished", "evicted")]
    for start in range(0, len(unsettled), 500):  # bound the statement's parameters
        rows = session.connection().execute(
            select(*_EVENT_COLUMNS)
            .where(QuotaEvent.kind.in_(list(EVENT_KINDS)), QuotaEvent.at >= until,
                   QuotaEvent.job_id.in_(unsettled[start : start + 500]))
            .order_by(QuotaEvent.id)
        )
        events += [Event(at, kind, str(job), *rest) for at, kind, job, *rest in rows]
    return events


def _events_before(since: float, until: float, *, session: Session) -> list[Event]:
    kinds = list(EVENT_KINDS)
    recent = select(QuotaEvent.job_id).where(QuotaEvent.at >= since, QuotaEvent.kind.in_(kinds)).distinct()
    rows = session.connection().execute(
        select(*_EVENT_COLUMNS)
        .where(
            QuotaEvent.kind.in_(kinds),
            QuotaEvent.at < until,
            or_(QuotaEvent.at >= since, QuotaEvent.job_id.in_(recent), QuotaEvent.job_id.in_(
                select(QuotaJob.id).where(QuotaJob.state.in_([s.value for s in JobState.holding()]))
            )),
        )
        .order_by(QuotaEvent.id)
    )
    return [Event(at, kind, None if job is None else str(job), *rest) for at, kind, job, *rest in rows]


class LogAccount(NamedTuple):
    """:func:`account_log`'s answer: the account, the holds it charged and the configurations in force."""

    account: Account
    holds: list[Hold]
    configs: list[Config]


def account_log(current: QuotaFile, periods: Sequence[tuple[float, float]], *, session: Session) -> LogAccount:
    """The account of ``periods`` (contiguous, in order) from the audit log, each moment charged with
    the quota file in force then (:func:`config_history`): the one account that the reports, the
    daily roll-up and the ``gpu_seconds`` counters share."""
    since, until = periods[0][0], periods[-1][1]
    holds = holds_from_events(accounting_events(since, until, session=session))
    configs = config_history(current, since, until, session=session)
    return LogAccount(account_history(configs, holds, periods), holds, configs)


def config_history(current: QuotaFile, since: float, until: float, *, session: Session) -> list[Config]:
    """The configurations in force over [since, until), oldest first, for
    :func:`~airflow_quota_provider.policy.accounting.account_history`.

    Each ``config_loaded`` event starts one with the job queues its ``detail`` records; an event
    without them (recorded before they were, or unreadable) stands for ``current``, the quota file
    read now. The first starts at :func:`install_start`, with ``current`` until the first
    ``config_loaded`` event. No event at all: nothing is charged. Only the event in force at
    ``since`` and the later ones are read (the metrics ask every few seconds).
    """
    start = install_start(session=session)
    if start is None:
        return []
    loaded = select(QuotaEvent.at, QuotaEvent.detail).where(QuotaEvent.kind == EventKind.CONFIG_LOADED.value)
    in_force = session.execute(
        loaded.where(QuotaEvent.at <= since).order_by(QuotaEvent.at.desc(), QuotaEvent.id.desc()).limit(1)
    ).all()
    rows = in_force + session.execute(
        loaded.where(QuotaEvent.at > since, QuotaEvent.at < until).order_by(QuotaEvent.at, QuotaEvent.id)
    ).all()
    parsed: dict[str | None, tuple] = {None: current.queues}  # one parse per distinct file
    history = [] if rows and rows[0].at <= max(start, since) else [Config(start, current.queues)]
    for at, detail in rows:
        if detail not in parsed:
            try:
                parsed[detail] = parse_quota_file(json.loads(detail), max_quotas_per_queue=1 << 30).queues
            except ValueError:  # PolicyError and JSONDecodeError both are: charge with today's file
                parsed[detail] = current.queues
        history.append(Config(at, parsed[detail]))
    return history


def install_start(*, session: Session) -> float | None:
    """When the install started: its first audit event or first rolled-up day (None: neither yet).
    Nothing is charged before it, so a report starts there at the earliest."""
    return min((at for at in (first_event_at(session=session), rolled_start(session=session)) if at is not None),
               default=None)


def rolled_start(*, session: Session) -> float | None:
    """The first rolled-up day, or None."""
    return session.scalar(select(func.min(QuotaUsageDaily.day)))


def first_event_at(*, session: Session) -> float | None:
    """When the audit log starts (any kind of event: the install's first configuration, or earlier)."""
    return session.scalar(select(func.min(QuotaEvent.at)))


def rolled_until(*, session: Session) -> float | None:
    """The end of the last rolled-up day (days before it are read from the roll-up), or None."""
    last = session.scalar(select(func.max(QuotaUsageDaily.day)))
    return None if last is None else last + DAY_S


def store_rollup(account: Account, queue_of: dict[str, str], *, session: Session) -> None:
    """Write an account of whole UTC days as roll-up rows: quotas' and DAGs' per GPU type, pools' summed."""
    for (day, quota, gpu_type), f in account.quota_types.items():
        session.add(QuotaUsageDaily(day=day, scope=QUOTA, queue=queue_of[quota], quota=quota, dag_id="",
                                    gpu_type=gpu_type or "", **{k: getattr(f, k) for k in _KINDS}))
    for (day, quota, gpu_type, dag_id), f in account.dag_types.items():
        session.add(QuotaUsageDaily(day=day, scope=DAG, queue=queue_of[quota], quota=quota, dag_id=dag_id or "-",
                                    gpu_type=gpu_type or "", **{k: getattr(f, k) for k in _KINDS}))
    for (day, queue), f in account.pools.items():
        session.add(QuotaUsageDaily(day=day, scope=POOL, queue=queue, quota="", dag_id="",
                                    capacity_s=f.capacity_s, drawn=f.drawn))
    session.flush()


def read_rollup(since: float, until: float, *, session: Session) -> Account:
    """The rolled-up days in [since, until) as an account (one period per day), quotas' and DAGs'
    figures per GPU type and summed over the types."""
    rows = session.scalars(
        select(QuotaUsageDaily).where(QuotaUsageDaily.day >= since, QuotaUsageDaily.day < until)
        .order_by(QuotaUsageDaily.day)
    ).all()
    result = Account(sorted({(r.day, r.day + DAY_S) for r in rows}), {}, {}, {})
    for r in rows:
        figures = Figures(**{k: getattr(r, k) for k in _KINDS})
        gpu_type = r.gpu_type or None
        if r.scope == QUOTA:
            result.quota_types[(r.day, r.quota, gpu_type)] = figures
            result.quotas.setdefault((r.day, r.quota), Figures()).add(figures)
        elif r.scope == DAG:
            dag_id = None if r.dag_id == "-" else r.dag_id
            result.dag_types[(r.day, r.quota, gpu_type, dag_id)] = figures
            result.dags.setdefault((r.day, r.quota, dag_id), Figures()).add(figures)
        else:
            result.pools[(r.day, r.queue)] = PoolFigures(r.capacity_s, r.drawn)
    return result


def delete_before(horizon: float, *, session: Session) -> tuple[int, int]:
    """Delete the jobs that ended before ``horizon`` and every event before it that no active or
    later job needs, but the ``config_loaded`` event in force at the horizon (later days are charged
    with it); returns (jobs, events) deleted."""
    ended = select(QuotaJob.id).where(
        QuotaJob.state.in_([JobState.FINISHED.value, JobState.FAILED.value]), QuotaJob.finished_at < horizon
    )
    kept = select(QuotaJob.id).where(QuotaJob.id.not_in(ended))
    in_force = session.scalar(
        select(QuotaEvent.id).where(QuotaEvent.kind == EventKind.CONFIG_LOADED.value, QuotaEvent.at < horizon)
        .order_by(QuotaEvent.at.desc(), QuotaEvent.id.desc()).limit(1)
    )
    events = session.execute(
        delete(QuotaEvent).where(
            QuotaEvent.at < horizon,
            QuotaEvent.id != (in_force if in_force is not None else -1),
            or_(QuotaEvent.job_id.is_(None), QuotaEvent.job_id.not_in(kept)),
        ).execution_options(synchronize_session=False)
    ).rowcount
    jobs = session.execute(
        delete(QuotaJob).where(QuotaJob.id.in_(ended)).execution_options(synchronize_session=False)
    ).rowcount
    return jobs, events
