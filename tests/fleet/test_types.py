"""GPU types on the fleet (issue 33): job queue gpu-typed of the fleet's quota file, with one h100 host
and two a100 hosts of 2 virtual GPUs each beside the fleet's three untyped hosts. A job asking for
h100 lands on the h100 host, an untyped one on the first type where it fits, a job waits naming its
type, and a reclaim on h100 preempts only h100 jobs. Real PostgreSQL, Redis, scheduler, api-server,
dag-processor and ``airflow quota worker --gpu-type`` hosts (tests/fleet/conftest.py)."""

from __future__ import annotations

import pytest

from tests.fleet.test_fleet import _decided_reason, _running, assert_no_device_held_twice
from tests.integration_support import wait_for

HOSTS = {"typed-h100": "h100", "typed-a100-1": "a100", "typed-a100-2": "a100"}


@pytest.fixture(scope="module")
def typed_hosts(fleet) -> dict[str, str]:
    """The typed queue's hosts, started at once. They run until the fleet stops: a host stopped
    before would be lost, and the other tests wait for no host to be lost."""
    fleet.start_workers(HOSTS, {host: ["--queues", "gpu-typed", "--virtual-gpus", "2", "--gpu-type", gpu_type]
                                for host, gpu_type in HOSTS.items()})
    return HOSTS


def _admitted(fleet, dag_id: str) -> dict[str, list[tuple[str, str]]]:
    """Task -> (host, what its admission says last: the GPU type) of each of its admissions."""
    out: dict[str, list[tuple[str, str]]] = {}
    for e in fleet.events("admitted", dag_id=dag_id):
        out.setdefault(e["task_id"], []).append((e["host"], e["message"].split("; ")[-1]))
    return out


def _waits(fleet, dag_id: str, task_id: str) -> str | None:
    """The job's pending reason once it waits (again) and a cycle decided on it."""
    rows = fleet.sql("SELECT state FROM quota_job WHERE dag_id=? AND task_id=? ORDER BY id DESC LIMIT 1", dag_id, task_id)
    return _decided_reason(fleet, dag_id, task_id) if rows and rows[0]["state"] == "pending" else None


def test_jobs_run_on_hosts_of_their_type_and_a_reclaim_preempts_only_jobs_of_its_type(fleet, typed_hosts):
    hold = fleet.trigger("types_hold")
    wait_for(lambda: _running(fleet, "d_h100", "d_a100"), "team-d borrowing on h100 and a100", timeout=240,
             on_timeout=lambda: fleet.tail("scheduler"))
    ask = fleet.trigger("types_ask")
    # team-c takes its h100 GPU back from d_h100 (priority 5), not from d_a100 (priority 1, also
    # borrowing, but on a100); d_h100 then waits on h100 alone, as it asked.
    reason = wait_for(lambda: _waits(fleet, "types_hold", "d_h100"), "d_h100 waiting after its reclaim", timeout=180,
                      on_timeout=lambda: fleet.tail("scheduler"))
    assert reason.startswith("h100: "), reason
    assert fleet.wait_run("types_ask", ask) == "success", fleet.tail("scheduler")
    assert fleet.wait_run("types_hold", hold) == "success", fleet.tail("scheduler")

    held, asked = _admitted(fleet, "types_hold"), _admitted(fleet, "types_ask")
    assert asked["c_h100"] == [("typed-h100", "GPU type h100")]
    assert len(asked["c_any"]) == 1 and asked["c_any"][0][1] == "GPU type a100", "h100 has no room within team-c's quota"
    assert typed_hosts[asked["c_any"][0][0]] == "a100"
    assert held["d_h100"] == [("typed-h100", "GPU type h100")] * 2, "preempted once, and back on h100"
    assert len(held["d_a100"]) == 1 and typed_hosts[held["d_a100"][0][0]] == "a100"
    assert [(e["task_id"], e["dag_id"]) for e in fleet.events("reclaimed") if e["dag_id"].startswith("types_")] == [
        ("d_h100", "types_hold")
    ]
    for ti in fleet.tis("types_hold", hold).values():
        assert (ti["state"], ti["try_number"]) == ("success", 1), dict(ti)
    assert_no_device_held_twice(fleet)
