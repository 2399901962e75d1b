"""QuotaCapacitySensor against the quota REST API of a running api-server (tests/quota_api_support.py).

Quota team-lab (reserve, capacity 2) is filled and emptied with seeded jobs; each case seeds its own.
"""

from __future__ import annotations

import asyncio

import pytest

from airflow.providers.common.compat.sdk import AirflowException, TaskDeferred
from airflow_quota_provider.sensors.quota_capacity import QuotaCapacitySensor
from airflow_quota_provider.triggers.quota_capacity import QuotaCapacityTrigger
from tests.quota_api_support import PASSWORDS, PORT, first_event_after
from tests.triggers.quota_files import RESERVED_NEIGHBOUR, executor_rejection, with_queue


@pytest.fixture(autouse=True)
def connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_API_DEFAULT", f"http://viewer:{PASSWORDS['viewer']}@127.0.0.1:{PORT}")
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_API_WRONG_PASSWORD", f"http://viewer:nope@127.0.0.1:{PORT}")


def _fill_lab(quota_api, case: str, devices: list[str]) -> int:
    return quota_api.seed({"case": case, "quota": "team-lab", "gpus": 2, "state": "running", "devices": devices})[case]


def test_poke_is_false_while_the_quota_is_full_and_true_once_a_job_finishes(quota_api):
    sensor = QuotaCapacitySensor(task_id="wait_for_lab", quota="team-lab", gpus=1)
    job_id = _fill_lab(quota_api, "sensor_poke_lab_full", ["10", "11"])
    assert sensor.poke({}) is False
    quota_api.finish(job_id)
    assert sensor.poke({}) is True


@pytest.mark.parametrize(
    ("quota", "gpus", "conn_id", "message"),
    [
        pytest.param("team-x", 1, "quota_api_default", "quota: 'team-x' is not one of team-a, team-b, team-lab",
                     id="unknown quota"),
        pytest.param("team-lab", 3, "quota_api_default",
                     "gpus: 3 would never be admitted: asks for 3 GPUs; quota team-lab can never hold more than 2 "
                     "(capacity 2, sharing reserve, job queue capacity 2)",
                     id="more than a reserve quota ever holds"),
        pytest.param("team-b", 9, "quota_api_default",
                     "gpus: 9 would never be admitted: asks for 9 GPUs; quota team-b can never hold more than 8 "
                     "(capacity 4, sharing lend_and_borrow, borrow_limit 4, job queue capacity 8)",
                     id="more than a borrower ever holds"),
        pytest.param("team-lab", 1, "quota_api_wrong_password", "401", id="credentials refused"),
    ],
)
def test_poke_fails_when_the_wait_could_never_end(quota_api, quota, gpus, conn_id, message):
    sensor = QuotaCapacitySensor(task_id="never", quota=quota, gpus=gpus, quota_conn_id=conn_id)
    with pytest.raises(AirflowException, match="QuotaCapacitySensor: ") as err:
        sensor.poke({})
    assert message in str(err.value)


def test_poke_fails_fast_with_the_executors_reason_when_others_reserve_the_capacity(quota_api):
    sensor = QuotaCapacitySensor(task_id="never_lent", quota="lender", gpus=6)
    with with_queue(quota_api, RESERVED_NEIGHBOUR), pytest.raises(AirflowException) as err:
        sensor.poke({})
    reason = executor_rejection(RESERVED_NEIGHBOUR, "lender", 6)
    assert str(err.value) == f"QuotaCapacitySensor: gpus: 6 would never be admitted: {reason}"


def test_deferrable_sensor_returns_at_once_when_the_quota_has_room(quota_api):
    sensor = QuotaCapacitySensor(task_id="room_now", quota="team-lab", gpus=2, deferrable=True)
    assert sensor.execute({}) is None  # no TaskDeferred


def test_deferrable_sensor_defers_while_full_and_completes_on_the_triggers_event(quota_api):
    sensor = QuotaCapacitySensor(task_id="wait_deferred", quota="team-lab", gpus=2, deferrable=True, poke_interval=0.2)
    job_id = _fill_lab(quota_api, "sensor_deferred_lab_full", ["12", "13"])
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    trigger = deferred.value.trigger
    assert isinstance(trigger, QuotaCapacityTrigger) and deferred.value.method_name == "execute_complete"

    event = asyncio.run(first_event_after(trigger, lambda: quota_api.finish(job_id)))
    assert event.payload == {"status": "success", "quota": "team-lab", "gpus": 2, "free": 2}
    assert sensor.execute_complete({}, event.payload) is None

    with pytest.raises(AirflowException, match="QuotaCapacitySensor: quota: 'gone' is not one of"):
        sensor.execute_complete({}, {"status": "error", "message": "quota: 'gone' is not one of team-a"})
