"""Wires the quota app and page into Airflow; the behaviour lives in :mod:`.app` and its routers."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from airflow_quota_provider.plugins.app import URL_PREFIX, create_app


class QuotaPlugin(AirflowPlugin):
    """REST API and UI page of the quota provider (``get_provider_info``'s ``plugins`` entry)."""

    name = "quota"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "GPU quotas"}]
    external_views = [
        {
            "name": "GPU quotas",
            "href": f"{URL_PREFIX}/ui/",
            "url_route": "gpu-quotas",
            "destination": "nav",
            "category": "browse",
        }
    ]
