"""Trigger that waits until a quota could start a job of a given size without preemption."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_quota_provider.hooks.quota_api import QuotaApiError, QuotaApiHook


class QuotaCapacityError(ValueError):
    """The wait can never end: unknown quota, or more GPUs than the quota can ever get."""


def has_capacity(status: dict[str, Any], quota: str, gpus: int) -> tuple[bool, int]:
    """Whether ``quota`` could start ``gpus`` GPUs now without preemption, and its ``free`` figure
    (``policy.summarize``'s, as ``GET /quota/api/quotas`` reports it).

    Raises :class:`QuotaCapacityError` naming the allowed quotas, or the most GPUs the quota can ever
    hold, when waiting would never end.
    """
    quotas = {q["name"]: q for q in status["quotas"]}
    if quota not in quotas:
        raise QuotaCapacityError(f"quota: {quota!r} is not one of {', '.join(quotas) or '(no quotas)'}")
    q = quotas[quota]
    queue = next((x for x in status["queues"] if x["name"] == q["queue"]), None)
    most = q["capacity"] if q["sharing"] != "lend_and_borrow" else (queue or {}).get("capacity", gpus)
    if q["sharing"] == "lend_and_borrow" and q["borrow_limit"] is not None:
        most = min(most, q["capacity"] + q["borrow_limit"])
    if gpus > most:
        raise QuotaCapacityError(
            f"gpus: {gpus} is more than quota {quota} can ever hold ({most}: capacity {q['capacity']}, "
            f"sharing {q['sharing']}, borrow_limit {q['borrow_limit']})"
        )
    return q["free"] >= gpus, q["free"]


class QuotaCapacityTrigger(BaseTrigger):
    """Poll the quota API until ``quota`` could admit ``gpus`` GPUs without preemption.

    Yields one event: ``{"status": "success", "quota", "gpus", "free"}``, or ``{"status": "error",
    "message"}`` when the wait can never end or the API refuses access. Unreachable-server errors are
    logged and polled again (the api-server may be restarting).

    :param quota: Quota name.
    :param gpus: GPUs the job would ask for.
    :param quota_conn_id: Connection to the Airflow api-server (see :mod:`~airflow_quota_provider.hooks.quota_api`).
    :param poll_interval: Seconds between polls.
    """

    def __init__(self, *, quota: str, gpus: int, quota_conn_id: str = QuotaApiHook.default_conn_name,
                 poll_interval: float = 30.0) -> None:
        super().__init__()
        self.quota = quota
        self.gpus = gpus
        self.quota_conn_id = quota_conn_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {"quota": self.quota, "gpus": self.gpus, "quota_conn_id": self.quota_conn_id,
             "poll_interval": self.poll_interval},
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = QuotaApiHook(self.quota_conn_id)
        while True:
            try:
                ready, free = has_capacity(await hook.aget_status(), self.quota, self.gpus)
            except QuotaCapacityError as e:
                yield TriggerEvent({"status": "error", "message": str(e)})
                return
            except QuotaApiError as e:
                if e.status in (401, 403, 404):
                    yield TriggerEvent({"status": "error", "message": str(e)})
                    return
                self.log.warning("Quota API failed, polling again: %s", e)
                ready, free = False, None
            except httpx.TransportError as e:
                self.log.warning("Quota API unreachable, polling again: %s", e)
                ready, free = False, None
            if ready:
                yield TriggerEvent({"status": "success", "quota": self.quota, "gpus": self.gpus, "free": free})
                return
            self.log.info("Quota %s can start %s of the %d GPUs asked for; waiting", self.quota, free, self.gpus)
            await asyncio.sleep(self.poll_interval)

