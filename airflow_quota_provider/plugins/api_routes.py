"""REST routes under ``/quota/api``. Quotas are Airflow pools, so reading needs pool read access and
changing a job's priority needs pool edit access (``PUT``) on the job's quota.

Every parameter is typed and bounded here, at the boundary: job ids are ASCII decimal strings of at
most ten digits, page offsets fit the database, bodies are strict (:mod:`.datamodels`); and every
status a route answers is in the OpenAPI document.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, status
from pydantic import WithJsonSchema

from airflow.api_fastapi.auth.managers.models.resource_details import PoolDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.common.router import AirflowRouter
from airflow.api_fastapi.core_api.openapi.exceptions import create_openapi_http_exception_doc
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_pool
from airflow_quota_provider.models.job import JobNotFound
from airflow_quota_provider.plugins import services
from airflow_quota_provider.plugins.datamodels import (
    CohortCollectionResponse,
    EventCollectionResponse,
    JobCollectionResponse,
    JobPatchBody,
    JobResponse,
    QueueCollectionResponse,
    QuotaCollectionResponse,
    UsageResponse,
)
from airflow_quota_provider.quota_file import QuotaFileUnavailable, configured_quota_file

api_router = AirflowRouter(tags=["Quota"], responses=create_openapi_http_exception_doc([401, 403]))

CanRead = [Depends(requires_access_pool("GET"))]
CanEdit = [Depends(requires_access_pool("PUT"))]

MAX_OFFSET = services.MAX_JOB_ID
"""Rows a page may skip: more than any table holds, and within what every database takes for OFFSET."""
JOB_ID_DOC = "Job id (the `id` of GET /jobs): ASCII decimal digits."
NO_NUL = "^[^\\x00]*$"
"""A text filter's pattern: PostgreSQL refuses a NUL in a string (psycopg2 raises before the query)."""


def in_query(**schema: object) -> WithJsonSchema:
    """An optional query parameter's schema as the query string carries it: FastAPI documents
    ``str | None`` as ``anyOf [string, null]``, but a query string has no null (absent is the default)."""
    return WithJsonSchema(schema)


def id_filter(what: str) -> object:
    """The type of an optional filter on an Airflow id, at most as long as the job table keeps it."""
    return Annotated[
        str | None,
        Query(max_length=services.ID_MAX_LENGTH, pattern=NO_NUL, description=f"Only jobs of this {what}."),
        in_query(type="string", maxLength=services.ID_MAX_LENGTH, pattern=NO_NUL),
    ]


def _quota_file():
    try:
        return configured_quota_file()
    except QuotaFileUnavailable as e:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(e))


@api_router.get("/queues", dependencies=CanRead, responses=create_openapi_http_exception_doc([503]))
def get_queues(session: SessionDep) -> QueueCollectionResponse:
    """Job queues: capacity, quotas, GPUs in use and jobs waiting."""
    return services.queues(_quota_file(), session=session)


@api_router.get("/quotas", dependencies=CanRead, responses=create_openapi_http_exception_doc([503]))
def get_quotas(session: SessionDep) -> QuotaCollectionResponse:
    """Quotas: capacity, in use, borrowed, lent, free, pending, sharing rule and limits."""
    return services.quotas(_quota_file(), session=session)


@api_router.get("/cohorts", dependencies=CanRead, responses=create_openapi_http_exception_doc([503]))
def get_cohorts(session: SessionDep) -> CohortCollectionResponse:
    """Cohorts: the groups of quotas of each job queue, with their subtrees' capacity, use, borrowing and lending."""
    return services.cohorts(_quota_file(), session=session)


@api_router.get("/jobs", dependencies=CanRead, responses=create_openapi_http_exception_doc([400]))
def get_jobs(
    session: SessionDep,
    quota: Annotated[
        str | None, Query(pattern=NO_NUL, description="Only jobs of this quota."), in_query(type="string", pattern=NO_NUL)
    ] = None,
    state: Annotated[
        list[str] | None,
        Query(description=f"Only jobs in these states (repeat or comma-separate): {', '.join(services.JOB_STATES)}."),
        in_query(type="array", items={"type": "string", "pattern": services.STATES_PATTERN}),
    ] = None,
    dag_id: id_filter("DAG") = None,
    run_id: id_filter("DAG run") = None,
    task_id: id_filter("task") = None,
    map_index: Annotated[
        int | None,
        Query(ge=-1, le=services.MAX_MAP_INDEX, description="Only jobs of this map index (-1: a task that is not mapped)."),
        in_query(type="integer", minimum=-1, maximum=services.MAX_MAP_INDEX),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 100,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Jobs to skip.")] = 0,
) -> JobCollectionResponse:
    """Jobs, oldest submission first: state, GPUs and devices, priority, preemptions, pending reason
    and position, times, and a link to the task instance. ``dag_id``, ``run_id``, ``task_id`` and
    ``map_index`` name a task instance: its jobs, one per try (the quota page's task instance view)."""
    try:
        quota_file = configured_quota_file()
    except QuotaFileUnavailable:
        quota_file = None  # the job rows are still worth showing
    try:
        return services.jobs(quota_file, quota=quota, states=state, limit=limit, offset=offset, session=session,
                             dag_id=dag_id, run_id=run_id, task_id=task_id, map_index=map_index)
    except services.BadRequest as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(e))


@api_router.patch(
    "/jobs/{job_id}", dependencies=CanEdit, responses=create_openapi_http_exception_doc([400, 404, 409, 503])
)
def patch_job(
    job_id: Annotated[str, Path(pattern=services.JOB_ID_PATTERN, description=JOB_ID_DOC)],
    body: JobPatchBody,
    user: GetUserDep,
    session: SessionDep,
) -> JobResponse:
    """Change a waiting or running job's priority; the next scheduling cycle uses it. Refused (400)
    above the quota's ``max_priority``; 404 for an id no job has. The change is written to the audit log."""
    from airflow.api_fastapi.app import get_auth_manager

    quota_file = _quota_file()
    try:
        job = services.get_job(job_id, session=session)
    except services.NotFound as e:
        raise HTTPException(status.HTTP_404_NOT_FOUND, str(e))
    if not get_auth_manager().is_authorized_pool(method="PUT", details=PoolDetails(name=job.quota), user=user):
        raise HTTPException(status.HTTP_403_FORBIDDEN, f"Forbidden: no edit access to pool {job.quota!r}")
    try:
        return services.change_priority(
            job_id, body.priority, quota_file, by=f"{user.get_name()} (REST API)", session=session
        )
    except (services.Conflict, JobNotFound) as e:
        raise HTTPException(status.HTTP_409_CONFLICT, str(e))
    except ValueError as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(e))


@api_router.get("/events", dependencies=CanRead, responses=create_openapi_http_exception_doc([400]))
def get_events(
    session: SessionDep,
    quota: Annotated[
        str | None, Query(pattern=NO_NUL, description="Only events of this quota."), in_query(type="string", pattern=NO_NUL)
    ] = None,
    kind: Annotated[
        list[str] | None,
        Query(description=f"Only events of these kinds (repeat or comma-separate): {', '.join(services.EVENT_KINDS)}."),
        in_query(type="array", items={"type": "string", "pattern": services.KINDS_PATTERN}),
    ] = None,
    job_id: Annotated[
        str | None,
        Query(pattern=services.JOB_ID_PATTERN, description=f"Only events of this job. {JOB_ID_DOC}"),
        in_query(type="string", pattern=services.JOB_ID_PATTERN),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=MAX_OFFSET, description="Events to skip (newest first).")] = 0,
) -> EventCollectionResponse:
    """The audit log, newest first, paged."""
    try:
        return services.events(quota=quota, kinds=kind, job_id=job_id, limit=limit, offset=offset, session=session)
    except services.BadRequest as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(e))


@api_router.get(
    "/usage",
    dependencies=CanRead,
    responses={**create_openapi_http_exception_doc([400, 503]),
               200: {"content": {"text/csv": {"schema": {"type": "string"}}},
                     "description": "The rows as JSON, or with `format=csv` as CSV (`airflow quota usage -o csv`)."}},
)
def get_usage(
    session: SessionDep,
    since: Annotated[str, Query(max_length=64, description="Start of the period (inclusive): ISO 8601 (UTC unless a zone is given) or POSIX seconds.")],
    until: Annotated[
        str | None,
        Query(max_length=64, description="End of the period (exclusive); default: now."),
        in_query(type="string", maxLength=64),
    ] = None,
    by: Annotated[
        str, Query(description="Charge per quota, dag or owner.", pattern="^(quota|dag|owner)$"),
    ] = "quota",
    every: Annotated[
        int | None,
        Query(ge=60, le=86400, description="Also return `series`: the quotas' rows per bucket of this many seconds "
              "(a divisor of a day; buckets start at multiples of it, UTC)."),
        in_query(type="integer", minimum=60, maximum=86400),
    ] = None,
    format: Annotated[str, Query(description="json, or csv for the rows as a CSV download.", pattern="^(json|csv)$")] = "json",
) -> UsageResponse:
    """GPU-seconds used within capacity, borrowed, lent, idle and lost to preemption over a period,
    per quota, DAG or DAG owner: the figures of `airflow quota usage`. 400 names the bad field."""
    try:
        if format == "csv":
            from fastapi.responses import PlainTextResponse

            return PlainTextResponse(services.usage_csv(_quota_file(), since, until, by, session=session),
                                     media_type="text/csv",
                                     headers={"Content-Disposition": f'attachment; filename="gpu-usage-by-{by}.csv"'})
        return services.usage(_quota_file(), since, until, by, every, session=session)
    except services.BadRequest as e:
        raise HTTPException(status.HTTP_400_BAD_REQUEST, str(e))
