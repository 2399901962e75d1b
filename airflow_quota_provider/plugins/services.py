"""What the REST and UI routes answer, built from the quota tables and the quota file.

The routes stay thin: they check access, parse parameters and call one function here. Reads go
through :mod:`airflow_quota_provider.usage`; the one write (a priority change) goes through
:func:`airflow_quota_provider.models.job.set_priority`, the same function ``airflow quota set-priority``
calls, and is then written to the task instance's ``priority_weight``
(:func:`~airflow_quota_provider.models.job.show_priority_on_task_instance`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING
from urllib.parse import quote

from sqlalchemy import func, select

from airflow_quota_provider.models.job import (
    EventKind,
    JobState,
    QuotaEvent,
    QuotaJob,
    QuotaPreemptionCount,
    UNDECIDED,
    active_job_rows,
    gpu_types_of,
    policy_job,
    set_priority,
    show_priority_on_task_instance,
)
from airflow_quota_provider.plugins import base_url
from airflow_quota_provider.plugins.datamodels import (
    CohortCollectionResponse,
    CohortResponse,
    CohortTypeResponse,
    EventCollectionResponse,
    EventResponse,
    FungibilityResponse,
    JobCollectionResponse,
    JobResponse,
    NodePlacement,
    PreemptionPolicyResponse,
    QueueCollectionResponse,
    QueueResponse,
    QueueTypeResponse,
    QuotaCollectionResponse,
    QuotaResponse,
    QuotaTypeResponse,
    UsageBucket,
    UsageResponse,
    UsageRow,
)
from airflow_quota_provider.plugins.datamodels_ui import (
    CohortTypeView,
    CohortView,
    DashboardResponse,
    PendingJobView,
    PreemptionView,
    QueueView,
    QuotaBarView,
    TypeFiguresView,
)
from airflow_quota_provider.policy import PolicyError, State
from airflow_quota_provider.policy.ordering import victim_order
from airflow_quota_provider.policy.preemption_policy import effective_max_preemptions, may_be_preempted, may_reclaim_from
from airflow_quota_provider.policy.types import running_by_type
from airflow_quota_provider.simulation.forecast import describe_start
from airflow_quota_provider.usage import (
    QuotaRow,
    bar_figures,
    cohort_figures,
    cohort_rows,
    held_devices,
    idle,
    job_hosts,
    job_nodes,
    pending_jobs,
    pending_reason,
    quota_rows,
)

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from sqlalchemy.orm import Session

    from airflow_quota_provider.models.job import ActiveJob
    from airflow_quota_provider.policy import Job, Quota, QuotaFile
    from airflow_quota_provider.policy.types import Fungibility

JOB_STATES = tuple(s.value for s in JobState)
EVENT_KINDS = tuple(k.value for k in EventKind)


def _one_or_more(choices: Sequence[str]) -> str:
    """The pattern of one query value that names one of ``choices``, or several separated by commas."""
    one = "|".join(choices)
    return rf"^ *({one}) *(, *({one}) *)*$"


STATES_PATTERN = _one_or_more(JOB_STATES)
"""One ``state`` query value: a job state, or several separated by commas."""
KINDS_PATTERN = _one_or_more(EVENT_KINDS)
"""One ``kind`` query value: an event kind, or several separated by commas."""
RECENT_PREEMPTIONS = 20

MAX_JOB_ID = 2**31 - 1
"""The largest job id: the job table's ``id`` column is a 32-bit integer on PostgreSQL and MySQL."""
MAX_MAP_INDEX = 2**31 - 1
"""The largest map index: a 32-bit integer column too."""
ID_MAX_LENGTH = 250
"""The longest ``dag_id``, ``run_id`` or ``task_id`` the job table keeps."""
JOB_ID_PATTERN = r"^[0-9]{1,10}$"
"""A job id as the API takes it: ASCII decimal digits only (``str.isdigit`` also accepts "²" and "١"),
at most as many as :data:`MAX_JOB_ID` has."""
_JOB_ID = re.compile(JOB_ID_PATTERN)
MAX_SHOWN = 100
"""Characters of a caller's value that an error message repeats."""


class BadRequest(ValueError):
    """A parameter has a value the API does not accept; the message names it and the allowed values."""


class NotFound(LookupError):
    """No such job."""


class Conflict(ValueError):
    """The job is not in a state that allows the change."""


def shown(value: str) -> str:
    """``repr`` of a caller's string for an error message, cut to :data:`MAX_SHOWN` characters."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(value)} characters)"


def parse_job_id(text: str) -> int | None:
    """The job id ``text`` names, or None when it names none: not ASCII decimal digits, or beyond
    :data:`MAX_JOB_ID` (no row can have it, and the database would refuse to compare it)."""
    if not _JOB_ID.fullmatch(text):  # fullmatch: "$" alone would let "1\n" through
        return None
    job_id = int(text)
    return job_id if job_id <= MAX_JOB_ID else None


def _dt(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def ti_url(job: QuotaJob) -> str:
    """The task instance's page in the Airflow UI (absolute when ``[api] base_url`` is set)."""
    url = f"{base_url()}/dags/{quote(job.dag_id, safe='')}/runs/{quote(job.run_id, safe='')}/tasks/{quote(job.task_id, safe='')}"
    return f"{url}/mapped/{job.map_index}" if job.map_index >= 0 else url


def _label(job: QuotaJob) -> str:
    mi = f"[{job.map_index}]" if job.map_index >= 0 else ""
    return f"{job.dag_id}.{job.task_id}{mi} ({job.run_id})"


def _queue_name(quota_file: QuotaFile | None, quota: str) -> str | None:
    if quota_file is None:
        return None
    try:
        return quota_file.queue_of(quota).name
    except (PolicyError, KeyError):
        return None


# ------------------------------------------------------------------------------------------ quotas


def queues(quota_file: QuotaFile, *, session: Session) -> QueueCollectionResponse:
    rows = quota_rows(quota_file, session=session)
    out = []
    for queue in quota_file.queues:
        mine = [r for r in rows if r.queue.name == queue.name]
        out.append(
            QueueResponse(
                name=queue.name,
                capacity=queue.capacity,
                capacity_unit=queue.capacity_unit,
                quotas=[q.name for q in queue.quotas],
                common_pool=queue.capacity - sum(q.capacity for q in queue.quotas) - sum(c.capacity for c in queue.cohorts),
                in_use=sum(r.usage.in_use for r in mine),
                pending_jobs=sum(r.usage.pending_jobs for r in mine),
                types=[
                    QueueTypeResponse(
                        name=t.name, capacity=t.capacity, instance_type=queue.instance_types.get(t.name),
                        in_use=sum(of.usage.in_use for r in mine for of in r.types if of.gpu_type == t.name),
                    )
                    for t in queue.types
                ] or None,
                fungibility=FungibilityResponse(
                    when_can_borrow=queue.fungibility.when_can_borrow.value,
                    when_can_preempt=queue.fungibility.when_can_preempt.value,
                ) if queue.types else None,
            )
        )
    return QueueCollectionResponse(queues=out, total_entries=len(out))


def _quota_response(row: QuotaRow) -> QuotaResponse:
    q, u = row.quota, row.usage
    return QuotaResponse(
        name=q.name,
        queue=row.queue.name,
        capacity=u.capacity,
        in_use=u.in_use,
        borrowed=u.borrowed,
        lent=u.lent,
        free=u.free,
        pending_jobs=u.pending_jobs,
        pending_gpus=u.pending_gpus,
        sharing=q.sharing,
        borrow_limit=q.borrow_limit,
        lend_limit=q.lend_limit,
        weight=q.weight,
        max_priority=q.max_priority,
        max_preemptions=q.max_preemptions,
        on_preemption_limit=q.on_preemption_limit,
        grace_period_s=q.grace_period_s,
        preemption=PreemptionPolicyResponse(
            within_quota=q.preemption.within_quota,
            reclaim=q.preemption.reclaim,
            borrow_within=q.preemption.borrow_within,
        ),
        cohort=q.cohort,
        types=[
            QuotaTypeResponse(name=t.gpu_type, capacity=t.usage.capacity, in_use=t.usage.in_use,
                              borrowed=t.usage.borrowed, lent=t.usage.lent, free=t.usage.free, idle=idle(t.usage))
            for t in row.types
        ] or None,
    )


def quotas(quota_file: QuotaFile, *, session: Session) -> QuotaCollectionResponse:
    out = [_quota_response(r) for r in quota_rows(quota_file, session=session)]
    return QuotaCollectionResponse(quotas=out, total_entries=len(out))


def cohorts(quota_file: QuotaFile, *, session: Session) -> CohortCollectionResponse:
    out = [
        CohortResponse(
            name=row.cohort.name,
            queue=row.queue.name,
            parent=row.cohort.parent,
            capacity=row.cohort.capacity,
            subtree_capacity=row.usage.capacity,
            in_use=row.usage.in_use,
            borrowed=row.usage.borrowed,
            lent=row.usage.lent,
            borrow_limit=row.cohort.borrow_limit,
            lend_limit=row.cohort.lend_limit,
            types=[
                CohortTypeResponse(name=t.gpu_type, subtree_capacity=t.usage.capacity, in_use=t.usage.in_use,
                                   borrowed=t.usage.borrowed, lent=t.usage.lent)
                for t in row.types
            ] or None,
        )
        for row in cohort_rows(quota_file, session=session)
    ]
    return CohortCollectionResponse(cohorts=out, total_entries=len(out))


# -------------------------------------------------------------------------------------------- jobs


def _preemption_counts(jobs: Iterable[QuotaJob], *, session: Session) -> dict[tuple, int]:
    keys = {(j.dag_id, j.run_id, j.task_id, j.map_index) for j in jobs}
    if not keys:
        return {}
    rows = session.scalars(select(QuotaPreemptionCount).where(QuotaPreemptionCount.dag_id.in_({k[0] for k in keys})))
    return {(r.dag_id, r.run_id, r.task_id, r.map_index): r.count for r in rows}


@dataclass(frozen=True)
class Holding:
    """What a running or stopping job holds, as the policy sees it now."""

    borrowed: int
    """GPUs above its quota's capacity (the rest of its GPUs are the quota's own)."""
    reclaim_candidate: bool
    """Whether a lender taking back its GPUs may preempt it now."""
    last_checkpoint_at: float | None


@dataclass(frozen=True)
class JobFacts:
    """Figures of a page of jobs that no column holds, computed once for the page."""

    counts: dict[tuple, int]
    devices: dict[int, dict[str, list[str]]]
    """Per job id: host -> the devices it holds there."""
    holdings: dict[int, Holding]
    waits: dict[int, float]
    quotas: dict[str, Quota]


def job_facts(jobs: Sequence[QuotaJob], quota_file: QuotaFile | None, *, now: float, session: Session) -> JobFacts:
    counts = _preemption_counts(jobs, session=session)
    pending = [j for j in jobs if j.state == JobState.PENDING.value]
    return JobFacts(
        counts=counts,
        devices=held_devices(session=session),
        # Only a page with a running or stopping job needs the policy's view of every running job.
        holdings=holdings(quota_file, now=now, session=session) if quota_file and any(
            j.state in (JobState.RUNNING.value, JobState.STOPPING.value) for j in jobs) else {},
        waits=waits_since(pending, session=session),
        quotas={} if quota_file is None else {q.name: q for queue in quota_file.queues for q in queue.quotas},
    )


def holdings(quota_file: QuotaFile, *, now: float, session: Session) -> dict[int, Holding]:
    """Per running or stopping job id: its borrowed GPUs and whether it is a reclaim candidate now.

    A quota's jobs fill its capacity in the reverse of the policy's victim order (the job a
    preemption would take last first), so the GPUs above it, summarize's ``borrowed``, are those
    of the jobs a reclaim stops first. A job is a reclaim candidate when it holds borrowed GPUs,
    may be preempted at all (``may_be_preempted``), and a quota of its queue lends GPUs now under a
    ``reclaim`` rule that reaches its priority. On a job queue with GPU types all of this is per type
    (each type is decided as a queue of its own): the quota's capacity of the job's type, and the
    quotas lending GPUs of that type."""
    from airflow_quota_provider.usage import quota_rows

    rows = [r for r in active_job_rows(session=session) if r.state != JobState.PENDING.value]
    counts = _preemption_counts(rows, session=session)
    lenders: dict[tuple[str, str | None], list[Quota]] = {}  # (job queue, GPU type or None) -> lending quotas
    for row in quota_rows(quota_file, session=session):
        lent = [(t.gpu_type, t.usage.lent) for t in row.types] if row.types else [(None, row.usage.lent)]
        for gpu_type, gpus in lent:
            if gpus > 0:
                lenders.setdefault((row.queue.name, gpu_type), []).append(row.quota)
    out: dict[int, Holding] = {}
    for queue in quota_file.queues:
        names = {quota.name for quota in queue.quotas}
        jobs = [policy_job(row, counts.get(_ti(row), 0), last_checkpoint_at=last_checkpoint_at(row))
                for row in rows if row.quota in names]
        if queue.types:
            by_type = running_by_type(State.for_queue(queue, jobs, ()))
            kinds = [(t.name, t.quotas, by_type[t.name]) for t in queue.types]
        else:
            kinds = [(None, queue.quotas, jobs)]
        for gpu_type, quotas, running in kinds:
            for quota in quotas:
                room = quota.capacity
                for job in sorted((j for j in running if j.quota == quota.name), key=lambda j: victim_order(j, now),
                                  reverse=True):
                    owned = min(job.gpus, room)
                    room -= owned
                    borrowed = job.gpus - owned
                    candidate = borrowed > 0 and may_be_preempted(job, quota, now) and any(
                        may_reclaim_from(lender, job) for lender in lenders.get((queue.name, gpu_type), ())
                        if lender.name != quota.name
                    )
                    out[int(job.id)] = Holding(borrowed, candidate, job.last_checkpoint_at)
    return out


def _ti(job: QuotaJob | ActiveJob) -> tuple[str, str, str, int]:
    return (job.dag_id, job.run_id, job.task_id, job.map_index)


def last_checkpoint_at(job: QuotaJob | ActiveJob) -> float | None:
    """When the running job last saved a checkpoint in this run, where this machine can see its
    checkpoint directory (a local or mounted ``[quota] checkpoint_root``); None when unknown."""
    from airflow_quota_provider.executors.runtimes import local_checkpoint_dir, newest_checkpoint_time

    at = newest_checkpoint_time(local_checkpoint_dir(*_ti(job)))
    return at if at is not None and job.started_at is not None and at >= job.started_at else None


WAIT_STARTS = (EventKind.STOPPED.value, EventKind.EVICTED.value, EventKind.REVOKED.value)
"""Events after which a job waits again at its original place (its ``submitted_at`` stays)."""


def waits_since(jobs: Sequence[QuotaJob], *, session: Session) -> dict[int, float]:
    """Per pending job id: when its current wait began, its submission or the last time it went
    back in line (preempted, evicted, revoked), whichever is later."""
    if not jobs:
        return {}
    last = dict(
        session.execute(
            select(QuotaEvent.job_id, func.max(QuotaEvent.at))
            .where(QuotaEvent.job_id.in_([j.id for j in jobs]), QuotaEvent.kind.in_(WAIT_STARTS))
            .group_by(QuotaEvent.job_id)
        ).all()
    )
    return {j.id: max(j.submitted_at, last.get(j.id) or j.submitted_at) for j in jobs}


def _job_response(job: QuotaJob, quota_file: QuotaFile | None, facts: JobFacts) -> JobResponse:
    pending = job.state == JobState.PENDING.value
    holding = facts.holdings.get(job.id)
    quota = facts.quotas.get(job.quota)
    preemptions = facts.counts.get(_ti(job), 0)
    placement = job_nodes(job, facts.devices.get(job.id, {}))
    now = time.time()
    return JobResponse(
        id=job.job_id,
        dag_id=job.dag_id,
        run_id=job.run_id,
        task_id=job.task_id,
        map_index=job.map_index,
        try_number=job.try_number,
        state=job.state,
        quota=job.quota,
        queue=job.queue_name or _queue_name(quota_file, job.quota),
        gpus=job.gpus,
        gpu_types=list(gpu_types_of(job.gpu_types)),
        gpu_type=job.gpu_type,
        owned_gpus=None if holding is None else job.gpus - holding.borrowed,
        borrowed_gpus=None if holding is None else holding.borrowed,
        reclaim_candidate=None if holding is None else holding.reclaim_candidate,
        nodes=job.nodes,
        host=job.host,
        hosts=job_hosts(job),
        devices=placement[0].devices if placement else [],
        placement=[NodePlacement(host=node.host, devices=node.devices) for node in placement],
        priority=job.priority,
        max_priority=None if quota is None else quota.max_priority,
        preemptible=job.preemptible,
        preemptions=preemptions,
        max_preemptions=job.max_preemptions,
        preemption_limit=None if quota is None else effective_max_preemptions(
            policy_job(job, preemptions), quota),
        last_checkpoint_at=None if holding is None else _dt(holding.last_checkpoint_at),
        pending_reason=pending_reason(job, now),
        pending_position=job.pending_position if pending else None,
        estimated_start_at=_dt(job.estimated_start_at) if pending else None,
        expected_start=describe_start(job.estimated_start_at, now) if pending else None,
        waiting_since=_dt(facts.waits.get(job.id)) if pending else None,
        preempted_for=job.preempted_for,
        submitted_at=_dt(job.submitted_at),
        started_at=_dt(job.started_at),
        finished_at=_dt(job.finished_at),
        message=job.message,
        ti_url=ti_url(job),
    )


def _paged(query, order, *, limit: int, offset: int, session: Session) -> tuple[int, Sequence]:
    """(rows matching ``query`` on all pages, the rows of this page in ``order``)."""
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    return total, session.scalars(query.order_by(*order).limit(limit).offset(offset)).all()


def parse_choices(values: Sequence[str] | None, choices: Sequence[str], field: str) -> list[str] | None:
    """Query values of ``field`` (repeatable, or comma-separated) checked against ``choices``."""
    if not values:
        return None
    wanted = [s.strip() for value in values for s in value.split(",")]
    for s in wanted:
        if s not in choices:
            raise BadRequest(f"{field}: {shown(s)} is not one of {', '.join(choices)}")
    return wanted


def jobs(
    quota_file: QuotaFile | None,
    *,
    quota: str | None,
    states: Sequence[str] | None,
    limit: int,
    offset: int,
    session: Session,
    dag_id: str | None = None,
    run_id: str | None = None,
    task_id: str | None = None,
    map_index: int | None = None,
) -> JobCollectionResponse:
    """A page of jobs of ``quota``, in ``states``, of the task instance ``dag_id`` ... ``map_index``
    names (each None: any)."""
    query = select(QuotaJob)
    if quota:
        query = query.where(QuotaJob.quota == quota)
    for column, value in ((QuotaJob.dag_id, dag_id), (QuotaJob.run_id, run_id), (QuotaJob.task_id, task_id),
                          (QuotaJob.map_index, map_index)):
        if value is not None:
            query = query.where(column == value)
    wanted = parse_choices(states, JOB_STATES, "state")
    if wanted:
        query = query.where(QuotaJob.state.in_(wanted))
    total, rows = _paged(query, (QuotaJob.submitted_at, QuotaJob.id), limit=limit, offset=offset, session=session)
    facts = job_facts(rows, quota_file, now=time.time(), session=session)
    return JobCollectionResponse(jobs=[_job_response(j, quota_file, facts) for j in rows], total_entries=total)


def get_job(job_id: str, *, session: Session) -> QuotaJob:
    """The job row with this id; :class:`NotFound` naming the id."""
    number = parse_job_id(job_id)
    job = None if number is None else session.get(QuotaJob, number)
    if job is None:
        raise NotFound(f"job {shown(job_id)} does not exist")
    return job


def change_priority(
    job_id: str, priority: int, quota_file: QuotaFile, *, by: str, session: Session
) -> JobResponse:
    """Set a waiting or running job's priority through :func:`~airflow_quota_provider.models.job.set_priority`
    (which checks ``max_priority`` and writes the ``priority_changed`` audit event, naming ``by``)."""
    job = get_job(job_id, session=session)
    if job.state not in {s.value for s in JobState.active()}:
        raise Conflict(
            f"job {job.job_id} is {job.state}; only {', '.join(s.value for s in JobState.active())} jobs can "
            "change priority"
        )
    changed = set_priority(
        job.dag_id, job.run_id, job.task_id, priority, map_index=job.map_index, quota_file=quota_file, by=by,
        session=session,
    )
    if changed.id != job.id:  # an older try of the task instance: the active job is a newer one
        raise Conflict(f"job {job.job_id} is superseded by job {changed.job_id} of the same task instance")
    show_priority_on_task_instance(changed, session=session)
    return _job_response(job, quota_file, job_facts([job], quota_file, now=time.time(), session=session))


# ------------------------------------------------------------------------------------------ events


def events(
    *,
    quota: str | None,
    kinds: Sequence[str] | None,
    job_id: str | None,
    limit: int,
    offset: int,
    session: Session,
) -> EventCollectionResponse:
    query = select(QuotaEvent)
    if quota:
        query = query.where(QuotaEvent.quota == quota)
    wanted = parse_choices(kinds, EVENT_KINDS, "kind")
    if wanted:
        query = query.where(QuotaEvent.kind.in_(wanted))
    if job_id:
        number = parse_job_id(job_id)
        if number is None:
            raise BadRequest(f"job_id: {shown(job_id)} is not a job id (ASCII digits, at most {MAX_JOB_ID})")
        query = query.where(QuotaEvent.job_id == number)
    total, rows = _paged(query, (QuotaEvent.id.desc(),), limit=limit, offset=offset, session=session)
    return EventCollectionResponse(events=[_event_response(e) for e in rows], total_entries=total)


def _event_response(e: QuotaEvent) -> EventResponse:
    return EventResponse(
        id=e.id,
        at=_dt(e.at),
        kind=e.kind,
        job_id=None if e.job_id is None else str(e.job_id),
        dag_id=e.dag_id,
        run_id=e.run_id,
        task_id=e.task_id,
        map_index=e.map_index,
        quota=e.quota,
        victim=e.victim,
        preemptor=e.preemptor,
        reason=e.reason,
        host=e.host,
        devices=[d for d in (e.devices or "").split(",") if d],
        message=e.message,
    )


# --------------------------------------------------------------------------------------------- UI


def dashboard(quota_file: QuotaFile, quota_path: str, *, editable: Sequence[str] = (), session: Session) -> DashboardResponse:
    """One snapshot of everything the quota page draws."""
    now = time.time()
    rows = quota_rows(quota_file, session=session)
    cohort_views = cohort_rows(quota_file, session=session)
    waiting: dict[str, list[PendingJobView]] = {}
    queued = pending_jobs(session=session)
    since = waits_since(queued, session=session)
    for job in queued:
        waiting.setdefault(job.quota, []).append(
            PendingJobView(
                id=job.job_id,
                label=_label(job),
                gpus=job.gpus,
                nodes=job.nodes,
                gpu_types=list(gpu_types_of(job.gpu_types)),
                priority=job.priority,
                position=job.pending_position,
                reason=pending_reason(job, now) or UNDECIDED,
                expected_start=describe_start(job.estimated_start_at, now),
                waiting_s=max(0.0, now - since[job.id]),
                ti_url=ti_url(job),
            )
        )
    views = []
    for queue in quota_file.queues:
        bars = []
        for row in (r for r in rows if r.queue.name == queue.name):
            q, u = row.quota, row.usage
            bars.append(
                QuotaBarView(
                    name=q.name,
                    **bar_figures(u),
                    sharing=q.sharing,
                    borrow_limit=q.borrow_limit,
                    lend_limit=q.lend_limit,
                    max_priority=q.max_priority,
                    pending_jobs=u.pending_jobs,
                    pending_gpus=u.pending_gpus,
                    pending=waiting.get(q.name, []),
                    cohort=q.cohort,
                    types=[TypeFiguresView(name=t.gpu_type, **bar_figures(t.usage)) for t in row.types],
                )
            )
        cohorts = [
            CohortView(name=c.cohort.name, parent=c.cohort.parent, **cohort_figures(c.usage),
                       types=[CohortTypeView(name=t.gpu_type, **cohort_figures(t.usage)) for t in c.types])
            for c in cohort_views if c.queue.name == queue.name
        ]
        views.append(
            QueueView(name=queue.name, capacity=queue.capacity, in_use=sum(b.owned + b.borrowed for b in bars), quotas=bars,
                      cohorts=cohorts, types=[f"{t.name}: {t.capacity}" for t in queue.types],
                      fungibility=_fungibility(queue.fungibility) if queue.types else None)
        )
    return DashboardResponse(
        generated_at=_dt(now),
        quota_file=quota_path,
        queues=views,
        preemptions=recent_preemptions(session=session),
        editable_quotas=list(editable),
    )


def _fungibility(fungibility: Fungibility) -> str:
    return (f"when it can borrow: {fungibility.when_can_borrow.value}; "
            f"when it can preempt: {fungibility.when_can_preempt.value}")


def recent_preemptions(*, limit: int = RECENT_PREEMPTIONS, session: Session) -> list[PreemptionView]:
    """The latest ``preempted`` events with both jobs named."""
    evs = session.scalars(
        select(QuotaEvent).where(QuotaEvent.kind == EventKind.PREEMPTED.value).order_by(QuotaEvent.id.desc()).limit(limit)
    ).all()
    named_ids = (parse_job_id(x) for e in evs for x in (e.victim, e.preemptor) if x)
    ids = {number for number in named_ids if number is not None}
    named = {str(j.id): j for j in session.scalars(select(QuotaJob).where(QuotaJob.id.in_(ids)))} if ids else {}
    out = []
    for e in evs:
        victim, preemptor = named.get(e.victim or ""), named.get(e.preemptor or "")
        out.append(
            PreemptionView(
                at=_dt(e.at),
                victim=_label(victim) if victim else f"job {e.victim}",
                victim_quota=e.quota,
                preemptor=_label(preemptor) if preemptor else f"job {e.preemptor}",
                preemptor_quota=preemptor.quota if preemptor else None,
                reason=e.reason,
                message=e.message,
            )
        )
    return out


def _usage_rows(quota_file: QuotaFile, since: str, until: str | None, by: str, *, session: Session):
    from airflow_quota_provider.usage_report import UsageRequestError, parse_time, usage_report

    try:
        start = parse_time(since, "since")
        end = parse_time(until, "until") if until else time.time()
        return start, end, usage_report(quota_file, start, end, by=by, session=session)
    except UsageRequestError as e:
        raise BadRequest(str(e)) from None


def _usage_row(row: dict, by: str) -> UsageRow:
    return UsageRow(key=row[by], **{k: row.get(k) for k in ("capacity_s", "used_within", "borrowed", "lent", "idle", "lost",
                                                            "gpu_type", "cost")})


def usage(
    quota_file: QuotaFile, since: str, until: str | None, by: str, every: int | None = None, *, session: Session
) -> UsageResponse:
    """GET /usage: :func:`~airflow_quota_provider.usage_report.usage_report`, as the CLI shows it;
    with ``every``, also :func:`~airflow_quota_provider.usage_report.usage_series`."""
    from airflow_quota_provider.usage_report import UsageRequestError, usage_series

    start, end, rows = _usage_rows(quota_file, since, until, by, session=session)
    series = None
    if every is not None:
        try:
            buckets = usage_series(quota_file, start, end, every, session=session)
        except UsageRequestError as e:
            raise BadRequest(str(e)) from None
        series = [UsageBucket(since=b["since"], until=b["until"], rows=[_usage_row(r, "quota") for r in b["rows"]])
                  for b in buckets]
    return UsageResponse(since=_dt(start), until=_dt(end), by=by, rows=[_usage_row(r, by) for r in rows], series=series)


def usage_csv(quota_file: QuotaFile, since: str, until: str | None, by: str, *, session: Session) -> str:
    """GET /usage?format=csv: the rows as ``airflow quota usage -o csv`` prints them."""
    from airflow_quota_provider.usage_report import usage_csv as to_csv

    return to_csv(_usage_rows(quota_file, since, until, by, session=session)[2], by)
