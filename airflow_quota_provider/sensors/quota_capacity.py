"""Sensor that waits until a quota could start a job of a given size without preemption."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowException, BaseSensorOperator, conf

from airflow_quota_provider.hooks.quota_api import QuotaApiError, QuotaApiHook
from airflow_quota_provider.triggers.quota_capacity import QuotaCapacityError, QuotaCapacityTrigger, has_capacity

if TYPE_CHECKING:
    from airflow.sdk import Context


class QuotaCapacitySensor(BaseSensorOperator):
    """
    Wait until ``quota`` could admit ``gpus`` GPUs now without preempting anyone.

    "Could admit" is ``policy.summarize``'s ``free`` for the quota (its own idle capacity plus what it
    may borrow), read from the quota REST API. ``poke`` is True when ``free >= gpus``, False otherwise,
    and raises an error that names the problem when the wait can never end (unknown quota, more GPUs
    than the quota can ever hold) or the API refuses the connection's user.

    :param quota: Quota name. (templated)
    :param gpus: GPUs the job would ask for. (templated)
    :param quota_conn_id: Connection to the Airflow api-server with a user that may read pools.
    :param deferrable: Wait in the triggerer; default ``[operators] default_deferrable``.
    :param poke_interval: Seconds between checks.
    """

    template_fields: Sequence[str] = ("quota", "gpus")
    ui_color = "#b4d9a8"

    def __init__(
        self,
        *,
        quota: str,
        gpus: int,
        quota_conn_id: str = QuotaApiHook.default_conn_name,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = 30,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.quota = quota
        self.gpus = gpus
        self.quota_conn_id = quota_conn_id
        self.deferrable = deferrable

    def poke(self, context: Context) -> bool:
        try:
            ready, free = has_capacity(QuotaApiHook(self.quota_conn_id).get_status(), self.quota, int(self.gpus))
        except (QuotaCapacityError, QuotaApiError) as e:
            raise AirflowException(f"QuotaCapacitySensor: {e}") from None
        self.log.info("Quota %s can start %d GPUs now; %s asked for", self.quota, free, self.gpus)
        return ready

    def execute(self, context: Context) -> None:
        if not self.deferrable:
            super().execute(context=context)
            return
        if self.poke(context):
            return
        self.defer(
            timeout=timedelta(seconds=self.timeout),
            trigger=QuotaCapacityTrigger(
                quota=self.quota, gpus=int(self.gpus), quota_conn_id=self.quota_conn_id, poll_interval=self.poke_interval
            ),
            method_name="execute_complete",
        )

    def execute_complete(self, context: Context, event: dict[str, Any] | None = None) -> None:
        if not event or event.get("status") != "success":
            raise AirflowException(f"QuotaCapacitySensor: {(event or {}).get('message', 'no event from the trigger')}")
        self.log.info("Quota %s can start %d GPUs now (%d asked for)", event["quota"], event["free"], event["gpus"])
