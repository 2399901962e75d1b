"""QuotaCapacityTrigger polling the quota REST API of a running api-server (tests/quota_api_support.py)."""

from __future__ import annotations

import asyncio

import pytest

from airflow_quota_provider.triggers.quota_capacity import QuotaCapacityError, QuotaCapacityTrigger, has_capacity
from tests.quota_api_support import PASSWORDS, PORT, first_event_after
from tests.triggers.quota_files import RESERVED_NEIGHBOUR, executor_rejection, with_queue


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
        pytest.param("team-lab", 5, "gpus: 5 would never be admitted: asks for 5 GPUs; quota team-lab can never hold "
                     "more than 2 (capacity 2, sharing reserve, job queue capacity 2)", id="never fits"),
    ],
)
def test_an_endless_wait_ends_with_an_error_event(quota_api, quota, gpus, message):
    async def first():
        return await QuotaCapacityTrigger(quota=quota, gpus=gpus, poll_interval=0.2).run().__anext__()

    event = asyncio.run(first())
    assert event.payload["status"] == "error" and message in event.payload["message"]


def test_a_job_the_executor_would_reject_ends_the_wait_with_the_executors_reason(quota_api):
    async def first():  # the first poll decides; a trigger still waiting after 10 s would wait for ever
        trigger = QuotaCapacityTrigger(quota="lender", gpus=6, poll_interval=0.2)
        return await asyncio.wait_for(trigger.run().__anext__(), 10)

    with with_queue(quota_api, RESERVED_NEIGHBOUR):
        event = asyncio.run(first())

    reason = executor_rejection(RESERVED_NEIGHBOUR, "lender", 6)
    assert reason == (
        "asks for 6 GPUs; quota lender can never hold more than 4 "
        "(capacity 4, sharing lend_and_borrow, job queue capacity 8)"
    )
    assert event.payload == {"status": "error", "message": f"gpus: 6 would never be admitted: {reason}"}


def _status(*quotas: dict, capacity: int = 8) -> dict:
    """``GET /quota/api/quotas`` and ``/queues`` as the API answers them, for one job queue."""
    full = [{"queue": "fleet", "sharing": "lend_and_borrow", "borrow_limit": None, "lend_limit": None,
             "max_priority": None, "free": 0} | q for q in quotas]
    return {"quotas": full, "queues": [{"name": "fleet", "capacity": capacity, "quotas": [q["name"] for q in full]}]}


@pytest.mark.parametrize(
    ("status", "gpus", "most"),
    [
        pytest.param(_status({"name": "a", "capacity": 4}, {"name": "b", "capacity": 4, "sharing": "reserve"}), 6, 4,
                     id="a borrower never gets another quota's reserved capacity"),
        pytest.param(_status({"name": "a", "capacity": 4}, {"name": "b", "capacity": 4, "sharing": "lend",
                                                              "lend_limit": 1}),
                     8, 5, id="nor the part another quota does not lend"),
        pytest.param(_status({"name": "a", "capacity": 4, "borrow_limit": 2}, {"name": "b", "capacity": 4}), 7, 6,
                     id="nor more than its borrow limit"),
        pytest.param(_status({"name": "a", "capacity": 4, "sharing": "lend"}, {"name": "b", "capacity": 4}), 5, 4,
                     id="a quota that does not borrow never holds more than its capacity"),
        pytest.param(_status({"name": "a", "capacity": 2}, {"name": "b", "capacity": 2, "sharing": "reserve"}), 7, 6,
                     id="a borrower may get the common pool"),
    ],
)
def test_the_wait_ends_exactly_where_the_executor_rejects(status, gpus, most):
    with pytest.raises(QuotaCapacityError, match=f"can never hold more than {most} "):
        has_capacity(status, "a", gpus)
    assert has_capacity(status, "a", most) == (False, 0)  # one fewer GPU is worth waiting for


def test_the_wait_ends_where_a_cohort_above_the_quota_stops_it():
    status = _status({"name": "a", "capacity": 4, "cohort": "ml"}, {"name": "b", "capacity": 4})
    status["cohorts"] = [{"name": "ml", "queue": "fleet", "parent": None, "capacity": 0, "borrow_limit": 1,
                          "lend_limit": None}]
    with pytest.raises(QuotaCapacityError, match="can never hold more than 5 .*in cohort ml"):
        has_capacity(status, "a", 6)
    assert has_capacity(status, "a", 5) == (False, 0)


@pytest.mark.parametrize("gpus", [0, -1, True])
def test_a_number_of_gpus_that_is_not_positive_is_refused(gpus):
    with pytest.raises(QuotaCapacityError, match="gpus: .* is not a positive integer"):
        has_capacity(_status({"name": "a", "capacity": 4}), "a", gpus)
