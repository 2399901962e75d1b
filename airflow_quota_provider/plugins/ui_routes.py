"""Routes of the quota page under ``/quota/ui``: the page itself, its script and style, and one JSON
snapshot per refresh. Every route declares its access (the Airflow UI's cookie authenticates it)."""

from __future__ import annotations

from pathlib import Path

from fastapi import Depends, HTTPException, status
from fastapi.responses import FileResponse

from airflow.api_fastapi.auth.managers.models.resource_details import AccessView, PoolDetails
from airflow.api_fastapi.common.db.common import SessionDep
from airflow.api_fastapi.common.router import AirflowRouter
from airflow.api_fastapi.core_api.openapi.exceptions import create_openapi_http_exception_doc
from airflow.api_fastapi.core_api.security import GetUserDep, requires_access_pool, requires_access_view
from airflow_quota_provider.plugins import services
from airflow_quota_provider.plugins.datamodels_ui import DashboardResponse
from airflow_quota_provider.quota_file import QuotaFileUnavailable, configured_quota_file

WWW = Path(__file__).parent / "www"
ASSETS = {"quota.js": "text/javascript", "quota.css": "text/css"}

ui_router = AirflowRouter(tags=["Quota UI"], responses=create_openapi_http_exception_doc([401, 403]))

CanView = [Depends(requires_access_view(AccessView.CLUSTER_ACTIVITY)), Depends(requires_access_pool("GET"))]


@ui_router.get("/", dependencies=CanView, include_in_schema=False)
def page() -> FileResponse:
    """The quota page (embedded in the Airflow UI by the plugin's external view)."""
    return FileResponse(WWW / "index.html", media_type="text/html", headers={"Cache-Control": "no-cache"})


@ui_router.get("/static/{name}", dependencies=CanView, include_in_schema=False)
def asset(name: str) -> FileResponse:
    """The page's script and style sheet (no build step, nothing from outside the machine)."""
    if name not in ASSETS:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"name: {name!r} is not one of {', '.join(ASSETS)}")
    return FileResponse(WWW / name, media_type=ASSETS[name], headers={"Cache-Control": "no-cache"})


@ui_router.get("/dashboard", dependencies=CanView, responses=create_openapi_http_exception_doc([503]))
def dashboard(session: SessionDep, user: GetUserDep) -> DashboardResponse:
    """Per quota: its bar, its waiting jobs with reason and position; recent preemptions; and the
    quotas whose jobs' priority this user may change (PATCH /quota/api/jobs/{id}'s per-pool check)."""
    from airflow.api_fastapi.app import get_auth_manager
    from airflow.configuration import conf

    try:
        quota_file = configured_quota_file()
    except QuotaFileUnavailable as e:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, str(e))
    auth = get_auth_manager()
    editable = [
        q.name for queue in quota_file.queues for q in queue.quotas
        if auth.is_authorized_pool(method="PUT", details=PoolDetails(name=q.name), user=user)
    ]
    return services.dashboard(quota_file, conf.get("quota", "quota_file"), editable=editable, session=session)
