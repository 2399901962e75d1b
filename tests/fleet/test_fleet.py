"""QuotaExecutor driving a GPU fleet through Celery: placement on one host, borrow and reclaim
across hosts, and a host that dies. Real PostgreSQL, Redis, scheduler, api-server, dag-processor and
three ``airflow quota worker`` hosts; no mock of Celery or of the launcher."""

from __future__ import annotations

import json
import time

from airflow_quota_provider.models.job import UNDECIDED
from tests.fleet.conftest import GPUS_PER_HOST, HOST_LOST_AFTER_S
from tests.integration_support import wait_for


def _starts(fleet, name: str) -> list[dict]:
    return [r for r in fleet.task_records() if r.get("name") == name and r["event"] == "start"]


def _running(fleet, *names: str) -> bool:
    records = fleet.task_records()
    return all(any(r.get("name") == n and r["event"] == "start" for r in records) for n in names)


def _devices(event) -> list[str]:
    return [d for d in (event["devices"] or "").split(",") if d]


def assert_no_device_held_twice(fleet) -> None:
    """Replay the audit log: a (host, device) is admitted only while free, and every one held is
    released by the job that held it; once every job has settled, nothing is held."""
    wait_for(lambda: not fleet.sql("SELECT 1 FROM quota_job WHERE state IN ('running', 'stopping')"),
             "every job to settle", timeout=120)
    held: dict[tuple[str, str], int] = {}
    for e in fleet.events():
        if e["kind"] == "admitted":
            for d in _devices(e):
                assert (e["host"], d) not in held, f"{(e['host'], d)} admitted to job {e['job_id']} while job {held.get((e['host'], d))} holds it"
                held[(e["host"], d)] = e["job_id"]
        elif e["kind"] == "released":
            for d in _devices(e):
                assert held.pop((e["host"], d), None) == e["job_id"], dict(e)
    assert held == {}, held


def _jobs(fleet, dag_id: str) -> dict[str, dict]:
    return {r["task_id"]: r for r in fleet.sql("SELECT * FROM quota_job WHERE dag_id=? ORDER BY id", dag_id)}


def _decided_reason(fleet, dag_id: str, task_id: str) -> str | None:
    """The job's pending reason once a scheduling cycle has decided on it (until then it says it waits for one)."""
    reason = (_jobs(fleet, dag_id).get(task_id) or {}).get("pending_reason")
    return None if reason == UNDECIDED else reason


def test_a_job_lands_on_one_host_with_room_and_fragmentation_is_named(fleet):
    fill = fleet.trigger("frag_fill")
    wait_for(lambda: _running(fleet, "big4", "mid3_x", "mid3_y"), "4+3+3 GPUs running", timeout=240,
             on_timeout=lambda: fleet.tail("scheduler"))
    small = fleet.trigger("frag_small")
    job = wait_for(lambda: _decided_reason(fleet, "frag_small", "small2"), "small2's pending reason", timeout=120)
    assert "fragment" in job, job
    assert "full" not in job.split(";")[0], job
    assert fleet.wait_run("frag_fill", fill) == "success"
    assert fleet.wait_run("frag_small", small) == "success"
    admitted = {e["task_id"]: e for e in fleet.events("admitted", dag_id="frag_fill")}
    hosts = {task: e["host"] for task, e in admitted.items()}
    assert len(set(hosts.values())) == 3, hosts  # 4 + 3 + 3 GPUs: one host each, never split
    assert {task: len(_devices(e)) for task, e in admitted.items()} == {"big4": 4, "mid3_x": 3, "mid3_y": 3}
    assert_no_device_held_twice(fleet)
    # On virtual GPUs a task trains on the CPU: its host gives it one thread, not one per core.
    assert {r["threads"] for r in fleet.task_records() if r["event"] == "start"} == {"1"}


def test_borrow_then_reclaim_resumes_on_another_host_without_a_retry(fleet):
    run_b = fleet.trigger("fleet_borrow_b")
    wait_for(lambda: _running(fleet, "b_victim", "b_short", "b_long"), "team-b on all three hosts", timeout=240,
             on_timeout=lambda: fleet.tail("scheduler"))
    assert len(fleet.events("borrowed", dag_id="fleet_borrow_b")) >= 1
    run_a = fleet.trigger("fleet_reclaim_a")
    assert fleet.wait_run("fleet_reclaim_a", run_a) == "success"
    assert fleet.wait_run("fleet_borrow_b", run_b) == "success"

    reclaimed = fleet.events("reclaimed", dag_id="fleet_borrow_b")
    assert [e["task_id"] for e in reclaimed] == ["b_victim"]
    records = [r for r in fleet.task_records() if r.get("name") == "b_victim"]
    events = [r["event"] for r in records]
    assert "sigterm" in events and "checkpointed" in events, records
    first, second = _starts(fleet, "b_victim")[:2]
    sigterm = next(r for r in records if r["event"] == "sigterm")
    assert second["resume_from"] and second["step"] == sigterm["step"], records
    assert first["host"] != second["host"], (first, second)
    assert second["preemptions"] == "1"
    victim_admits = [e["host"] for e in fleet.events("admitted", dag_id="fleet_borrow_b") if e["task_id"] == "b_victim"]
    assert victim_admits == [first["host"], second["host"]]
    # The victim was on another host than the one its notice came from (the scheduler's), and its
    # grace period (10 s) was honoured: forced only after it, if at all.
    preempted = fleet.events("preempted", dag_id="fleet_borrow_b")[0]
    for forced in fleet.events("forced", dag_id="fleet_borrow_b"):
        assert forced["at"] - preempted["at"] >= 10
    a_host = fleet.events("admitted", dag_id="fleet_reclaim_a")[0]["host"]
    assert a_host == first["host"], "team-a takes back the host its victim held"
    for ti in fleet.tis("fleet_borrow_b", run_b).values():
        assert ti["state"] == "success" and ti["try_number"] == 1, dict(ti)
    assert_no_device_held_twice(fleet)


def test_a_dead_host_s_jobs_run_again_elsewhere_from_their_checkpoints(fleet):
    run = fleet.trigger("host_loss")
    wait_for(lambda: _running(fleet, "k0", "k1"), "k0 and k1 running", timeout=240,
             on_timeout=lambda: fleet.tail("scheduler"))
    time.sleep(3)  # a few steps, each checkpointed, before the host dies
    jobs = _jobs(fleet, "host_loss")
    assert jobs["k0"]["host"] == jobs["k1"]["host"], "best fit: both 2-GPU jobs on one host"
    doomed = jobs["k0"]["host"]
    fleet.kill_host(doomed)

    status = wait_for(lambda: _lost(fleet, doomed), f"{doomed} out of airflow quota status", timeout=HOST_LOST_AFTER_S + 60)
    assert all(row["queue_gpus"] == 2 * GPUS_PER_HOST for row in status), status
    assert fleet.wait_run("host_loss", run) == "success"

    evicted = fleet.events("evicted", dag_id="host_loss")
    assert sorted(e["task_id"] for e in evicted) == ["k0", "k1"]
    assert fleet.events("host_lost")[-1]["host"] == doomed
    for name in ("k0", "k1"):
        starts = _starts(fleet, name)
        assert len(starts) == 2, starts
        assert starts[0]["host"] == doomed and starts[1]["host"] != doomed, starts
        assert starts[1]["resume_from"] and starts[1]["step"] > 0, starts
    for ti in fleet.tis("host_loss", run).values():
        assert ti["state"] == "success" and ti["try_number"] == 1, dict(ti)
    assert fleet.sql("SELECT count(*) AS n FROM quota_preemption_count WHERE dag_id='host_loss'")[0]["n"] == 0
    assert_no_device_held_twice(fleet)

    fleet.start_worker(doomed)  # the host comes back and rejoins
    status = wait_for(lambda: _status(fleet) if all(r["queue_gpus"] == 12 for r in _status(fleet)) else None,
                      f"{doomed} back in airflow quota status", timeout=60)
    assert all(row["hosts_lost"] == "" for row in status), status


def _status(fleet) -> list[dict]:
    """``airflow quota status`` of job queue gpu-fleet (the other is test_types.py's)."""
    return [row for row in json.loads(fleet.quota("status", "-o", "json")) if row["queue"] == "gpu-fleet"]


def _lost(fleet, host: str):
    rows = _status(fleet)
    return rows if rows and all(host in row.get("hosts_lost", "") for row in rows) else None
