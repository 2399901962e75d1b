"""A client of the provider's REST API (``/quota/api`` on the Airflow api-server).

Tasks and triggers cannot read the quota tables themselves: Airflow 3 blocks database access from
task and trigger processes ("Database access is disabled from Dags and Triggers"). They ask the
api-server instead, with the credentials of an Airflow connection:

- host and port (or a full ``http(s)://host:port`` host) of the api-server;
- login and password of an Airflow user with pool read access (a JWT is taken from ``/auth/token``),
  or ``{"token": "<JWT>"}`` in the connection's extra.

Example: ``AIRFLOW_CONN_QUOTA_API_DEFAULT='http://viewer:secret@airflow-api:8080'``.
"""

from __future__ import annotations

from typing import Any

import httpx

from airflow.providers.common.compat.sdk import BaseHook

QUOTAS_PATH = "/quota/api/quotas"
QUEUES_PATH = "/quota/api/queues"
COHORTS_PATH = "/quota/api/cohorts"
TOKEN_PATH = "/auth/token"


class QuotaApiError(RuntimeError):
    """The API refused or failed a request; the message names the URL and the status."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class QuotaApiHook(BaseHook):
    """Reads quotas and job queues from the quota REST API, synchronously or from a trigger.

    :param quota_conn_id: Connection to the Airflow api-server (see the module docstring).
    """

    conn_name_attr = "quota_conn_id"
    default_conn_name = "quota_api_default"
    conn_type = "http"
    hook_name = "Airflow quota API"

    def __init__(self, quota_conn_id: str = default_conn_name, timeout: float = 30.0) -> None:
        super().__init__()
        self.quota_conn_id = quota_conn_id
        self.timeout = timeout
        self._token: str | None = None

    # ---------------------------------------------------------------------------- connection

    @staticmethod
    def _base_url(conn) -> str:
        host = (conn.host or "").rstrip("/")
        if not host:
            raise QuotaApiError(f"connection {conn.conn_id!r}: host is empty; set it to the Airflow api-server")
        if "://" in host:
            return host
        scheme = "https" if conn.conn_type == "https" or conn.schema == "https" else "http"
        return f"{scheme}://{host}:{conn.port}" if conn.port else f"{scheme}://{host}"

    @staticmethod
    def _credentials(conn) -> dict[str, str] | None:
        if conn.login:
            return {"username": conn.login, "password": conn.password or ""}
        return None

    @staticmethod
    def _check(response: httpx.Response) -> Any:
        if response.status_code >= 400:
            try:
                detail = response.json().get("detail")
            except ValueError:
                detail = response.text[:200]
            raise QuotaApiError(
                f"{response.request.method} {response.request.url}: {response.status_code} {detail}",
                status=response.status_code,
            )
        return response.json()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._token}", "Accept": "application/json"}

    # ----------------------------------------------------------------------------------- sync

    def get_status(self) -> dict[str, Any]:
        """``{"quotas": [...], "queues": [...], "cohorts": [...]}`` as ``GET /quota/api/quotas``, ``/queues``
        and ``/cohorts`` give them.

        An expired token is replaced once."""
        try:
            return self._get_status()
        except QuotaApiError as e:
            if e.status != 401:
                raise
            self._token = None
            return self._get_status()

    def _get_status(self) -> dict[str, Any]:
        conn = self.get_connection(self.quota_conn_id)
        with httpx.Client(base_url=self._base_url(conn), timeout=self.timeout) as client:
            if self._token is None:
                self._token = conn.extra_dejson.get("token")
            if self._token is None and (body := self._credentials(conn)):
                self._token = self._check(client.post(TOKEN_PATH, json=body))["access_token"]
            return {
                "quotas": self._check(client.get(QUOTAS_PATH, headers=self._headers()))["quotas"],
                "queues": self._check(client.get(QUEUES_PATH, headers=self._headers()))["queues"],
                "cohorts": self._check(client.get(COHORTS_PATH, headers=self._headers()))["cohorts"],
            }

    # ---------------------------------------------------------------------------------- async

    async def aget_status(self) -> dict[str, Any]:
        """:meth:`get_status` for triggers (does not block the triggerer's event loop)."""
        try:
            return await self._aget_status()
        except QuotaApiError as e:
            if e.status != 401:
                raise
            self._token = None
            return await self._aget_status()

    async def _aget_status(self) -> dict[str, Any]:
        conn = await self.aget_connection(self.quota_conn_id)
        async with httpx.AsyncClient(base_url=self._base_url(conn), timeout=self.timeout) as client:
            if self._token is None:
                self._token = conn.extra_dejson.get("token")
            if self._token is None and (body := self._credentials(conn)):
                self._token = self._check(await client.post(TOKEN_PATH, json=body))["access_token"]
            return {
                "quotas": self._check(await client.get(QUOTAS_PATH, headers=self._headers()))["quotas"],
                "queues": self._check(await client.get(QUEUES_PATH, headers=self._headers()))["queues"],
                "cohorts": self._check(await client.get(COHORTS_PATH, headers=self._headers()))["cohorts"],
            }
