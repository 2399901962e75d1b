"""Wires the quota app and page into Airflow; the behaviour lives in :mod:`.app` and its routers.

Every task process loads the plugins (for their macros) and so imports this module: the app is
built only where ``fastapi_apps`` is read (the api-server, ``airflow plugins``), since building it
imports the api-server's own modules, about half a second of CPU a task would spend for nothing.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from airflow.plugins_manager import AirflowPlugin

from airflow_quota_provider.operators.links import QuotaJobLink
from airflow_quota_provider.plugins import URL_PREFIX


@cache
def _fastapi_apps() -> list[dict[str, Any]]:
    from airflow_quota_provider.plugins.app import create_app

    return [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "GPU quotas"}]


class _BuiltWhenRead:
    def __get__(self, instance: object, owner: type) -> list[dict[str, Any]]:
        return _fastapi_apps()


class QuotaPlugin(AirflowPlugin):
    """REST API, UI page and task instance link of the quota provider (the package's ``airflow.plugins``
    entry point, its only registration)."""

    name = "quota"
    fastapi_apps = _BuiltWhenRead()
    external_views = [
        {
            "name": "GPU quotas",
            "href": f"{URL_PREFIX}/ui/",
            "url_route": "gpu-quotas",
            "destination": "nav",
            "category": "browse",
        }
    ]
    # Resolved by the api-server when asked, so that a task waiting for its first run has the link too.
    operator_extra_links = [QuotaJobLink()]
