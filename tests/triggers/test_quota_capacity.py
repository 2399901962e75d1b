"""QuotaCapacityTrigger polling the quota REST API of a running api-server (tests/quota_api_support.py)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_quota_provider.triggers.quota_capacity import QuotaCapacityTrigger
from tests.quota_api_support import PASSWORDS, PORT, first_event_after


@pytest.fixture(autouse=True)
def connection(monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_QUOTA_API_DEFAULT", f"http://viewer:{PASSWORDS['viewer']}@127.0.0.1:{PORT}")


def test_serializes_to_its_own_class_path_and_arguments():
    trigger = QuotaCapacityTrigger(quota="team-a", gpus=3, quota_conn_id="c", poll_interval=5)
    path, kwargs = trigger.serialize()
    assert path == "airflow_quota_provider.triggers.quota_capacity.QuotaCapacityTrigger"
    assert kwargs == {"quota": "team-a", "gpus": 3, "quota_conn_id": "c", "poll_interval": 5}
    assert QuotaCapacityTrigger(**kwargs).serialize() == (path, kwargs)


def test_waits_while_the_quota_is_full_and_fires_when_a_job_frees_its_gpus(quota_api):
    case = "trigger_lab_full"
    job_id = quota_api.seed({"case": case, "quota": "team-lab", "gpus": 2, "state": "running", "devices": ["14", "15"]})[case]
    trigger = QuotaCapacityTrigger(quota="team-lab", gpus=1, poll_interval=0.2)
    event = asyncio.run(first_event_after(trigger, lambda: quota_api.finish(job_id)))
    assert event.payload == {"status": "success", "quota": "team-lab", "gpus": 1, "free": 2}


@pytest.mark.parametrize(
    ("quota", "gpus", "message"),
    [
        pytest.param("team-x", 1, "quota: 'team-x' is not one of team-a, team-b, team-lab", id="unknown quota"),
        pytest.param("team-lab", 5, "gpus: 5 is more than quota team-lab can ever hold", id="never fits"),
    ],
)
def test_an_endless_wait_ends_with_an_error_event(quota_api, quota, gpus, message):
    async def first():
        return await QuotaCapacityTrigger(quota=quota, gpus=gpus, poll_interval=0.2).run().__anext__()

    event = asyncio.run(first())
    assert event.payload["status"] == "error" and message in event.payload["message"]
