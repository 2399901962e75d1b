"""A gang on the fleet: a 2-node torch.distributed job (gloo, CPU, through torchrun) on the fleet
tests' three Celery hosts, borrowing GPUs; its lender takes them back, both nodes checkpoint, and it
resumes on another pair of hosts with the same result as an uninterrupted run; a gang whose member's
host takes no launch backs off and fails at its start limit without using a retry. Real PostgreSQL,
Redis, scheduler, api-server, dag-processor and ``airflow quota worker`` hosts (tests/fleet/conftest.py)."""

from __future__ import annotations

import json
import signal
import time

import pytest

from airflow_quota_provider.executors.celery_worker import host_queue
from tests.fleet.test_fleet import assert_no_device_held_twice
from tests.integration_support import wait_for

pytest.importorskip("torch", reason="the gang trains with torch.distributed (scripts/bootstrap installs it)")

STEPS = 60


def _ddp(fleet, event: str) -> list[dict]:
    return [r for r in fleet.task_records() if r.get("name") == "ddp" and r["event"] == event]


def test_a_gang_reclaimed_from_checkpoints_on_both_nodes_and_resumes_on_other_hosts_with_the_same_result(fleet):
    run_b = fleet.trigger("gang_borrow_b")
    wait_for(lambda: len(_ddp(fleet, "start")) == 2, "both nodes of the gang to start training", timeout=300,
             on_timeout=lambda: fleet.tail("scheduler") + fleet.tail("worker-gpu-a"))
    time.sleep(3)  # a few steps, each checkpointed, before its lender takes its GPUs back
    run_a = fleet.trigger("gang_reclaim_a")
    assert fleet.wait_run("gang_reclaim_a", run_a, timeout=600) == "success", fleet.tail("scheduler")
    assert fleet.wait_run("gang_borrow_b", run_b, timeout=600) == "success", fleet.tail("scheduler")

    # One victim, one preemption, no retry: the gang is preempted as one.
    assert [e["task_id"] for e in fleet.events("reclaimed", dag_id="gang_borrow_b")] == ["ddp"]
    assert fleet.sql("SELECT count FROM quota_preemption_count WHERE dag_id='gang_borrow_b'")[0]["count"] == 1
    (ti,) = fleet.tis("gang_borrow_b", run_b).values()
    assert (ti["state"], ti["try_number"]) == ("success", 1)

    starts = _ddp(fleet, "start")
    assert len(starts) == 4 and {r["world"] for r in starts} == {2}, starts
    first, second = starts[:2], starts[2:]
    assert {r["node"] for r in first} == {r["node"] for r in second} == {"0", "1"}, starts
    assert len({r["host"] for r in first}) == len({r["host"] for r in second}) == 2, "each node on a host of its own"
    assert {r["host"] for r in first} != {r["host"] for r in second}, "resumed on another pair of hosts"
    stopped = _ddp(fleet, "checkpointed")
    assert sorted(r["node"] for r in stopped) == ["0", "1"], "both nodes stopped on the notice"
    assert len({r["step"] for r in stopped}) == 1, "after the same step"
    assert all(r["resume_from"] and r["step"] == stopped[0]["step"] > 0 for r in second), (second, stopped)

    done = _ddp(fleet, "done")
    assert sorted(r["node"] for r in done) == ["0", "1"]
    assert {r["total"] for r in done} == {3 * STEPS * (STEPS + 1) / 2}, "the same result as an uninterrupted run"
    admitted = fleet.events("admitted", dag_id="gang_borrow_b")
    assert [e["message"].split("; ")[-1] for e in admitted] == ["node 0 of 2", "node 1 of 2"] * 2
    assert_no_device_held_twice(fleet)


def test_a_node_that_fails_stops_the_other_and_the_task_fails_naming_it(fleet):
    started = time.monotonic()
    run = fleet.trigger("gang_node_fails")
    assert fleet.wait_run("gang_node_fails", run, timeout=300) == "failed"
    assert time.monotonic() - started < 300, "node 0's 600 s command was stopped with the gang"
    member_host = [e["host"] for e in fleet.events("admitted", dag_id="gang_node_fails")][1]
    (log,) = fleet.home.glob("logs/dag_id=gang_node_fails/**/attempt=1.log")
    assert f"gang stopped: node 1 of 2 on host {member_host} exited with code 3" in log.read_text()
    assert fleet.sql("SELECT count(*) AS n FROM quota_job WHERE dag_id='gang_node_fails' AND state='finished'")[0]["n"] == 1
    assert_no_device_held_twice(fleet)


def test_a_gang_whose_member_host_dies_is_evicted_as_one_and_runs_again_on_live_hosts(fleet):
    run = fleet.trigger("gang_host_loss")
    starts = wait_for(lambda: [r for r in fleet.task_records() if r.get("name") == "pair" and r["event"] == "start"]
                      if len([r for r in fleet.task_records() if r.get("name") == "pair"]) == 2 else None,
                      "both nodes of the gang to start", timeout=240, on_timeout=lambda: fleet.tail("scheduler"))
    doomed = next(r["host"] for r in starts if r["node"] == "1")
    fleet.kill_host(doomed)
    try:
        assert fleet.wait_run("gang_host_loss", run, timeout=400) == "success", fleet.tail("scheduler")
        (ti,) = fleet.tis("gang_host_loss", run).values()
        assert (ti["state"], ti["try_number"]) == ("success", 1), "no retry used"
        (evicted,) = fleet.events("evicted", dag_id="gang_host_loss")
        assert f"gang ended: node 1 of 2 on host {doomed} lost" in evicted["message"]
        assert fleet.sql("SELECT count(*) AS n FROM quota_preemption_count WHERE dag_id='gang_host_loss'")[0]["n"] == 0
        again = [r for r in fleet.task_records() if r.get("name") == "pair" and r["event"] == "start"][2:]
        assert sorted(r["node"] for r in again) == ["0", "1"] and doomed not in {r["host"] for r in again}, again
        assert_no_device_held_twice(fleet)
    finally:
        fleet.start_worker(doomed)  # the host comes back for the tests after this one
        wait_for(lambda: not fleet.sql("SELECT 1 FROM quota_host WHERE state = 'lost'"), f"{doomed} to rejoin", timeout=120)


# A gang whose member cannot start: a scheduler of this test's own runs it with short gang timeouts
# (these [quota] settings are read by the scheduler alone); the fleet's scheduler is back after it.
# A member sent to a host that does not take it ends the gang after launch_start_timeout_s (its
# gang_start_timeout_s counts only until the member is sent: node 0 has published its command).
GANG_START = {
    "AIRFLOW__QUOTA__LAUNCH_START_TIMEOUT_S": "5",
    "AIRFLOW__QUOTA__GANG_BACKOFF_S": "2",
    "AIRFLOW__QUOTA__GANG_START_LIMIT": "2",
}


def _restart_scheduler(fleet, env: dict[str, str] | None = None) -> None:
    proc = fleet.procs.pop("scheduler", None)
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    fleet.start_process("scheduler", "scheduler", env=env)


def _consume(fleet, hosts: list[str], *, on: bool) -> None:
    """Hosts' Celery workers stop (or go back to) consuming their own queue: they heartbeat and
    answer remote control as before, but take no launch meanwhile."""
    control = fleet._broker().control
    for host in hosts:
        change = control.add_consumer if on else control.cancel_consumer
        replies = change(host_queue(host), destination=[f"celery@{host}"], reply=True, timeout=5)
        assert [list(r) for r in replies] == [[f"celery@{host}"]] and "ok" in replies[0][f"celery@{host}"], replies


def test_a_gang_whose_member_cannot_start_is_requeued_with_backoff_without_a_retry_then_fails_at_its_start_limit(fleet):
    wait_for(lambda: not fleet.sql("SELECT 1 FROM quota_job WHERE state IN ('running', 'stopping')"), "an idle fleet",
             timeout=120, on_timeout=lambda: fleet.tail("scheduler"))
    # Node 0 goes on the first host (an idle fleet's hosts tie, by name); no other host takes the
    # member's launch.
    blocked = ["gpu-b", "gpu-c"]
    not_before: list[float] = []  # when each backoff ends, as the executor set it

    def ended() -> bool:
        job = fleet.sql("SELECT gang FROM quota_job WHERE dag_id='gang_start_fails'")
        until = json.loads(job[0]["gang"] or "{}").get("not_before") if job else None
        if until is not None and until not in not_before:
            not_before.append(until)
        return bool(fleet.sql("SELECT 1 FROM dag_run WHERE dag_id='gang_start_fails' AND state IN ('success', 'failed')"))

    try:
        _restart_scheduler(fleet, GANG_START)
        _consume(fleet, blocked, on=False)
        run = fleet.trigger("gang_start_fails")
        wait_for(ended, "the gang's starts to run out", timeout=240, interval=0.5,
                 on_timeout=lambda: f"{fleet.unfinished('gang_start_fails', run)}\n{fleet.tail('scheduler')}")
    finally:
        _consume(fleet, blocked, on=True)
        _restart_scheduler(fleet)

    admitted = fleet.events("admitted", dag_id="gang_start_fails")
    assert [(e["host"], e["message"].split("; ")[-1]) for e in admitted] == [
        ("gpu-a", "node 0 of 2"), ("gpu-b", "node 1 of 2")] * 3, [dict(e) for e in admitted]
    # Three starts, of node 0 each time and of its member never: each ended the gang as one.
    (job,) = fleet.sql("SELECT * FROM quota_job WHERE dag_id='gang_start_fails'")
    members = fleet.sql("SELECT * FROM quota_launch WHERE job_id=? AND node_rank=1", job["id"])
    assert len(members) == 3 and all(m["worker_pid"] is None and m["state"] == "cancelled" for m in members), members
    nodes0 = fleet.sql("SELECT * FROM quota_launch WHERE job_id=? AND node_rank=0", job["id"])
    assert len(nodes0) == 3 and all(n["worker_pid"] for n in nodes0), nodes0
    never_taken = "node 1 of 2 on host gpu-b was never taken by its host"

    # The first two: back in line without a retry, and admitted again only after a backoff that doubles.
    evicted = fleet.events("evicted", dag_id="gang_start_fails")
    assert [e["message"].split("; waits")[0] for e in evicted] == [
        f"gang ended: {never_taken}; admitted again after 2 s (start 1 of 3)",
        f"gang ended: {never_taken}; admitted again after 4 s (start 2 of 3)",
    ]
    assert len(not_before) == 2, not_before
    for failed_start, until, next_start in zip(evicted, not_before, admitted[2::2]):
        assert failed_start["at"] < until <= next_start["at"], (dict(failed_start), until, dict(next_start))
    assert not fleet.events("preempted", dag_id="gang_start_fails")

    # The third, past the limit: the task fails saying why, on its first try (its one retry unused).
    (ti,) = fleet.tis("gang_start_fails", run).values()
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 1)
    assert not fleet.sql("SELECT 1 FROM task_instance_history WHERE dag_id='gang_start_fails'")
    why = f"the gang did not start 3 times ([quota] gang_start_limit 2); last: {never_taken}"
    assert (job["state"], job["message"]) == ("failed", why)
    (failed,) = fleet.sql("SELECT extra FROM log WHERE dag_id='gang_start_fails' AND event='quota failed'")
    assert failed["extra"] == f"QuotaExecutor: {why}"
    assert not fleet.sql("SELECT 1 FROM quota_device_allocation WHERE job_id=?", job["id"])
    assert_no_device_held_twice(fleet)
