"""Quota metrics through Airflow's ``Stats`` (StatsD, Datadog or OpenTelemetry, as ``[metrics]`` says).

QuotaExecutor calls :func:`emit_metrics` once per heartbeat. It sets the per-quota gauges from the
same figures the REST API shows, and turns the audit events written since the last count into counters
and a wait-time timer. The counters' cursors are shared by the schedulers (:mod:`.models.meter`), so
with two schedulers nothing is counted twice; the first count ever skips history. A count sent by a
cycle that then fails to commit is sent again by the next one (counters are at least once).
Every metric is named with the quota (``quota.gpus_in_use.team-a``, for StatsD, which has no tags) and
also carries ``quota`` and ``queue`` tags (for Datadog and OTel). A quota of a job queue with GPU types
also has its gauges per type, named and tagged with it (``quota.gpus_in_use.team-a.h100``, tag
``gpu_type``). ``docs/metrics.md`` lists them.

:class:`GpuSecondsMeter` counts GPU-seconds per quota and kind (used within capacity, borrowed, lent,
idle, lost) with the usage accounting core, over the time since its previous call.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from sqlalchemy import func, select

from airflow.sdk.observability.stats import Stats, normalize_name_for_stats
from airflow_quota_provider.models import meter
from airflow_quota_provider.models.coordination import METRICS, try_lock
from airflow_quota_provider.models.job import EventKind, QuotaEvent, QuotaJob
from airflow_quota_provider.models.usage import account_log
from airflow_quota_provider.policy.accounting import KINDS, lost_by_end
from airflow_quota_provider.usage import cohort_rows, quota_rows

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from collections.abc import Mapping

    from airflow_quota_provider.policy import QuotaFile, State

log = logging.getLogger(__name__)

GAUGES = ("gpus_in_use", "borrowed", "lent", "free", "pending_jobs", "pending_gpus")
"""Per-quota gauges: ``quota.<gauge>.<quota>``; a quota in a cohort also carries a ``cohort`` tag."""

TYPE_GAUGES = ("gpus_in_use", "borrowed", "lent", "free")
"""Per-quota gauges per GPU type of a typed job queue: ``quota.<gauge>.<quota>.<type>``, also tagged
``gpu_type`` (a waiting job has no type until it is admitted: the pending gauges are the quota's only)."""

COHORT_GAUGES = ("gpus_in_use", "borrowed", "lent")
"""Per-cohort gauges of its subtree: ``quota.cohort.<gauge>.<cohort>``, tagged ``cohort`` and ``queue``;
a typed job queue's also per GPU type, ``quota.cohort.<gauge>.<cohort>.<type>``, tagged ``gpu_type``."""

_USAGE_FIELD = {"gpus_in_use": "in_use"}


def emit_metrics(quota_file: QuotaFile, *, session: Session, states: Mapping[str, State] | None = None) -> None:
    """Emit the per-quota gauges, and counters for the audit events since the last count (unless
    another scheduler is counting them in this moment: it sends them).

    ``states`` (job queue -> the state the executor just decided on) spares reading the jobs again.
    A failure is logged and never raised (metrics must not stop scheduling); the cursor then stays
    where it was (a savepoint keeps the caller's transaction usable).
    """
    try:
        with session.begin_nested():
            _emit_gauges(quota_file, session=session, states=states)
            if not try_lock([METRICS], session=session):
                return
            last = session.scalar(select(func.max(QuotaEvent.id))) or 0
            since = meter.position(meter.EVENTS, session=session)
            if since is not None:
                _emit_event_metrics(quota_file, int(since), last, session=session)
            meter.move(meter.EVENTS, last, session=session)
    except Exception:
        log.warning("Could not emit quota metrics", exc_info=True)


def _name(metric: str, *parts: str) -> str:
    return normalize_name_for_stats(".".join(["quota", metric, *parts]))


def _emit_gauges(quota_file: QuotaFile, *, session: Session, states: Mapping[str, State] | None) -> None:
    for row in quota_rows(quota_file, session=session, states=states):
        tags = {"quota": row.quota.name, "queue": row.queue.name}
        if row.quota.cohort is not None:
            tags["cohort"] = row.quota.cohort
        _gauges((), GAUGES, row.quota.name, row.usage, tags)
        for of_type in row.types:
            _gauges((), TYPE_GAUGES, f"{row.quota.name}.{of_type.gpu_type}", of_type.usage,
                    {**tags, "gpu_type": of_type.gpu_type})
    for row in cohort_rows(quota_file, session=session, states=states):
        tags = {"cohort": row.cohort.name, "queue": row.queue.name}
        _gauges(("cohort",), COHORT_GAUGES, row.cohort.name, row.usage, tags)
        for of_type in row.types:
            _gauges(("cohort",), COHORT_GAUGES, f"{row.cohort.name}.{of_type.gpu_type}", of_type.usage,
                    {**tags, "gpu_type": of_type.gpu_type})


def _gauges(prefix: tuple[str, ...], gauges: tuple[str, ...], of: str, usage: object, tags: dict[str, str]) -> None:
    """``quota.<prefix>.<gauge>.<of>`` for each gauge, from ``usage``'s field of that name."""
    for gauge in gauges:
        Stats.gauge(_name(*prefix, gauge, of), getattr(usage, _USAGE_FIELD.get(gauge, gauge)), tags=tags)


def _emit_event_metrics(quota_file: QuotaFile, since_event_id: int, last: int, *, session: Session) -> None:
    kinds = [EventKind.ADMITTED.value, EventKind.PREEMPTED.value, EventKind.PREEMPTION_LIMIT_REACHED.value,
             EventKind.REJECTED.value]
    events = session.scalars(
        select(QuotaEvent)
        .where(QuotaEvent.id > since_event_id, QuotaEvent.id <= last, QuotaEvent.kind.in_(kinds))
        .order_by(QuotaEvent.id)
    ).all()
    for event in events:
        quota = event.quota or "unknown"
        tags = {"quota": quota, "queue": _queue(quota_file, quota)}
        if event.kind == EventKind.ADMITTED.value:
            Stats.incr(_name("admissions", quota), tags=tags)
            waited = _wait_s(event, session=session)
            if waited is not None:
                Stats.timing(_name("wait_time", quota), timedelta(seconds=waited), tags=tags)
        elif event.kind == EventKind.PREEMPTED.value:
            reason = event.reason or "unknown"
            Stats.incr(_name("preemptions", quota, reason), tags={**tags, "reason": reason})
        elif event.kind == EventKind.PREEMPTION_LIMIT_REACHED.value:
            Stats.incr(_name("preemption_limit_failures", quota), tags=tags)
        else:
            Stats.incr(_name("rejections", quota), tags=tags)


def _queue(quota_file: QuotaFile, quota: str) -> str:
    try:
        return quota_file.queue_of(quota).name
    except Exception:
        return "unknown"


def _wait_s(admitted: QuotaEvent, *, session: Session) -> float | None:
    """Seconds the job waited before this admission: since it was submitted, or since it last went
    back to its queue (a preempted job's ``submitted_at`` keeps its original place, not its wait)."""
    if admitted.job_id is None:
        return None
    back = session.scalar(
        select(func.max(QuotaEvent.at)).where(
            QuotaEvent.job_id == admitted.job_id,
            QuotaEvent.kind.in_([EventKind.STOPPED.value, EventKind.REVOKED.value]),
            QuotaEvent.id < admitted.id,
        )
    )
    start = back if back is not None else session.scalar(
        select(QuotaJob.submitted_at).where(QuotaJob.id == admitted.job_id)
    )
    return None if start is None else max(0.0, admitted.at - start)


class GpuSecondsMeter:
    """Counters ``quota.gpu_seconds.<quota>.<kind>`` (tags ``quota``, ``queue``, ``kind``): the
    GPU-seconds the accounting core charges each quota over the time since the previous call.

    The span counted is shared by the schedulers (:data:`~.models.meter.GPU_SECONDS`): each call
    counts from where the last count of any scheduler ended. Counters take whole numbers, so each
    call sends the whole GPU-seconds accrued and carries the fraction to its next call: the sum sent
    stays within one GPU-second per scheduler of ``airflow quota usage`` over the same time.
    ``lost`` is counted when the preempted job's GPUs are freed (the report cuts it at period
    boundaries instead). The first count ever only starts the clock (history is not counted).
    """

    def __init__(self, every_s: float = 15.0) -> None:
        self.every_s = every_s
        """Send at most this often: each call reads the events of every job holding GPUs, too much
        for every scheduling cycle of a large fleet (counters need no finer grain)."""
        self._carry: dict[tuple[str, str], float] = {}

    def emit(self, quota_file: QuotaFile, *, session: Session, now: float) -> None:
        """Send the counters for [the last count's end, ``now``) unless another scheduler is counting;
        a failure is logged, never raised, and the same span is tried again next time."""
        try:
            with session.begin_nested():
                if not try_lock([METRICS], session=session):
                    return
                since = meter.position(meter.GPU_SECONDS, session=session)
                if since is not None and (now - since < self.every_s or now <= since):
                    return
                if since is not None:
                    self._send(quota_file, since, now, session=session)
                meter.move(meter.GPU_SECONDS, now, session=session)
        except Exception:
            log.warning("Could not count quota GPU-seconds", exc_info=True)

    def _send(self, quota_file: QuotaFile, since: float, now: float, *, session: Session) -> None:
        result, holds, _ = account_log(quota_file, [(since, now)], session=session)
        lost = lost_by_end(holds, since, now)
        for (_, quota), figures in result.quotas.items():
            tags = {"quota": quota, "queue": _queue(quota_file, quota)}
            for kind in KINDS:
                seconds = lost.get(quota, 0.0) if kind == "lost" else getattr(figures, kind)
                whole, self._carry[quota, kind] = divmod(self._carry.get((quota, kind), 0.0) + seconds, 1.0)
                if whole:
                    Stats.incr(_name("gpu_seconds", quota, kind), count=int(whole), tags={**tags, "kind": kind})
