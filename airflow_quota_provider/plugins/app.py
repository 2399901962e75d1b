"""The FastAPI app the plugin mounts at ``/quota``: ``/api`` (REST) and ``/ui`` (the page).

Airflow mounts plugin apps without authentication, so every route declares its own access
dependency; FastAPI's own documentation routes are off and the OpenAPI document is served behind
authentication at ``/quota/api/openapi.json``.
"""

from __future__ import annotations

from fastapi import Depends, FastAPI

from airflow.api_fastapi.core_api.security import requires_authenticated

URL_PREFIX = "/quota"


def create_app() -> FastAPI:
    from airflow_quota_provider.plugins.api_routes import api_router
    from airflow_quota_provider.plugins.ui_routes import ui_router

    app = FastAPI(
        title="Airflow quota provider",
        description="Shared GPU quotas: job queues, quotas, jobs, the audit log and priority changes.",
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
    )
    app.include_router(api_router, prefix="/api")
    app.include_router(ui_router, prefix="/ui")

    @app.get("/api/openapi.json", dependencies=[Depends(requires_authenticated())], include_in_schema=False)
    def openapi() -> dict:
        return app.openapi()

    return app
