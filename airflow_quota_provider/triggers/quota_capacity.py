"""Trigger that waits until a quota could start a job of a given size without preemption."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_quota_provider.hooks.quota_api import QuotaApiError, QuotaApiHook
from airflow_quota_provider.policy import Cohort, Job, Quota, State, rejection_reason


class QuotaCapacityError(ValueError):
    """The wait can never end: unknown quota, or more GPUs than the quota can ever get."""


def has_capacity(status: dict[str, Any], quota: str, gpus: int) -> tuple[bool, int]:
    """Whether ``quota`` could start ``gpus`` GPUs now without preemption, and its ``free`` figure
    (``policy.summarize``'s, as ``GET /quota/api/quotas`` reports it).

    Raises :class:`QuotaCapacityError` when waiting would never end: an unknown quota (naming the
    known ones), or a job the executor would reject, with the executor's own reason
    (:func:`~airflow_quota_provider.policy.rejection_reason` over the quota's job queue as the API
    describes it, so other quotas' reserved capacity counts as it does in the executor).
    """
    quotas = {q["name"]: q for q in status["quotas"]}
    if quota not in quotas:
        raise QuotaCapacityError(f"quota: {quota!r} is not one of {', '.join(quotas) or '(no quotas)'}")
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise QuotaCapacityError(f"gpus: {gpus!r} is not a positive integer")
    state = queue_state(status, quotas[quota]["queue"])
    policy_quota = next(q for q in state.quotas if q.name == quota)
    # The sensor asks about size only: a job at the highest priority the quota allows.
    job = Job(id="capacity-check", quota=quota, gpus=gpus, priority=policy_quota.max_priority or 0, submitted_at=0.0)
    reason = rejection_reason(job, policy_quota, state)
    if reason is not None:
        raise QuotaCapacityError(f"gpus: {gpus} would never be admitted: {reason}")
    free = quotas[quota]["free"]
    return free >= gpus, free


def queue_state(status: dict[str, Any], queue: str) -> State:
    """Job queue ``queue`` as the policy core sees it, from the API's ``queues``, ``quotas`` and
    ``cohorts``: its capacity, its quotas' rules and its tree (no jobs; the figures that depend on jobs
    come from the API)."""
    (described,) = [q for q in status["queues"] if q["name"] == queue]
    by_name = {q["name"]: q for q in status["quotas"]}
    quotas = tuple(
        Quota(
            name=name,
            capacity=by_name[name]["capacity"],
            sharing=by_name[name]["sharing"],
            borrow_limit=by_name[name]["borrow_limit"],
            lend_limit=by_name[name]["lend_limit"],
            max_priority=by_name[name]["max_priority"],
            cohort=by_name[name].get("cohort"),
        )
        for name in described["quotas"]
    )
    cohorts = tuple(
        Cohort(name=c["name"], parent=c["parent"], capacity=c["capacity"], borrow_limit=c["borrow_limit"],
               lend_limit=c["lend_limit"])
        for c in status.get("cohorts", ()) if c["queue"] == queue
    )
    return State(capacity=described["capacity"], quotas=quotas, running=(), pending=(), cohorts=cohorts)


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

