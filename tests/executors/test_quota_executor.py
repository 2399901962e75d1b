"""QuotaExecutor in a real Airflow 3.3 (scheduler, dag-processor, api-server on SQLite)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time

from tests.executors.conftest import QUEUED_TIMEOUT_S
from tests.integration_support import wait_for
from tests.policy.test_documents import billion_laughs


def _started(airflow, name_prefix: str, count: int):
    starts = [r for r in airflow.task_records() if r["event"] == "start" and r.get("name", r.get("task_id", "")).startswith(name_prefix)]
    return starts if len(starts) >= count else None


def test_borrow_then_reclaim_resumes_without_using_a_retry(airflow):
    airflow.wait_dag("reclaim_a")
    run_b = airflow.trigger("borrow_b")
    # team-b has 2 GPUs of its own: all four of its tasks run, two of them on team-a's idle GPUs.
    wait_for(lambda: _started(airflow, "b", 4), "four team-b tasks running", timeout=300,
             on_timeout=lambda: airflow.tail("scheduler"))
    borrowed = airflow.events("borrowed", dag_id="borrow_b")
    assert len(borrowed) == 2, [dict(e) for e in airflow.events(dag_id="borrow_b")]

    run_a = airflow.trigger("reclaim_a")
    assert airflow.wait_run("reclaim_a", run_a) == "success"
    assert airflow.wait_run("borrow_b", run_b) == "success"

    reclaimed = airflow.events("reclaimed", dag_id="borrow_b")
    assert len(reclaimed) == 2
    victims = {e["task_id"] for e in reclaimed}
    records = airflow.task_records()
    for victim in victims:
        mine = [r for r in records if r.get("name") == victim]
        events = [r["event"] for r in mine]
        # SIGTERM reached the command, which checkpointed, and a later run resumed from it.
        assert "sigterm" in events and "checkpointed" in events, mine
        sigterm = next(r for r in mine if r["event"] == "sigterm")
        resumed = [r for r in mine if r["event"] == "start" and r["resume_from"]]
        assert resumed and resumed[0]["step"] == sigterm["step"], mine
        assert resumed[0]["preemptions"] == "1"
        assert events[-1] == "done"
    tis = airflow.tis("borrow_b", run_b)
    for task_id, ti in tis.items():
        assert ti["state"] == "success" and ti["try_number"] == 1, dict(ti)
    # Each run saw exactly the devices it was admitted on.
    admitted = airflow.events("admitted", dag_id="borrow_b")
    for r in records:
        if r.get("name", "").startswith("b") and r["event"] == "start":
            assert r["devices"] in {e["devices"] for e in admitted if e["task_id"] == r["name"]}, r
    # Every quota is an Airflow pool with unlimited slots: the executor, not the pool, gates tasks.
    pools = {r["pool"]: r["slots"] for r in airflow.sql("SELECT pool, slots FROM slot_pool")}
    assert pools["team-a"] == pools["team-b"] == -1
    counts = airflow.sql("SELECT task_id, count FROM quota_preemption_count WHERE dag_id='borrow_b'")
    assert {r["task_id"]: r["count"] for r in counts} == {v: 1 for v in victims}
    # The grace period (6 s for team-b) was honoured: a victim is forced only after it, if at all.
    for e in airflow.events("preempted", dag_id="borrow_b"):
        forced = [f for f in airflow.events("forced", dag_id="borrow_b") if f["job_id"] == e["job_id"]]
        assert all(f["at"] - e["at"] >= 6 for f in forced), (dict(e), [dict(f) for f in forced])


def _task_starts(airflow, dag_id: str, task_id: str) -> list[dict]:
    return [r for r in airflow.task_records() if r.get("dag_id") == dag_id and r.get("task_id") == task_id
            and r["event"] == "start"]


def test_within_quota_priority_preempts_a_plain_task_through_the_fallback_path(airflow):
    airflow.wait_dag("prio_high")
    run_low = airflow.trigger("prio_low")
    wait_for(lambda: _task_starts(airflow, "prio_low", "low"), "the low-priority task to start",
             on_timeout=lambda: airflow.tail("scheduler"))
    run_high = airflow.trigger("prio_high")
    assert airflow.wait_run("prio_high", run_high) == "success"
    assert airflow.wait_run("prio_low", run_low) == "success"

    preempted = airflow.events("preempted", dag_id="prio_low")
    assert [(e["reason"], e["task_id"]) for e in preempted] == [("within_quota", "low")]
    # Its grace period (3 s for team-p) was honoured: it was stopped by force only after it.
    forced = airflow.events("forced", dag_id="prio_low")
    assert len(forced) == 1 and forced[0]["at"] - preempted[0]["at"] >= 3
    # The plain task ignored the preempt file; past its grace period it was stopped by Airflow and
    # ran again later, on the same try.
    starts = _task_starts(airflow, "prio_low", "low")
    assert len(starts) == 2 and [s["try_number"] for s in starts] == [1, 1]
    assert starts[1]["preemptions"] == "1"
    high = _task_starts(airflow, "prio_high", "high")[0]
    assert starts[0]["t"] < high["t"] < starts[1]["t"]
    ti = airflow.tis("prio_low", run_low)["low"]
    assert (ti["state"], ti["try_number"]) == ("success", 1)


def _team_s(airflow) -> tuple[int, int, int]:
    status = json.loads(airflow.airflow("quota", "status", "--output", "json").stdout)
    team_s = next(row for row in status if row["quota"] == "team-s")
    return team_s["in_use"], team_s["pending_jobs"], team_s["pending_gpus"]


def test_set_priority_on_a_waiting_task_changes_which_runs_next(airflow):
    airflow.wait_dag("set_waiters")
    airflow.trigger("set_block")
    (block,) = wait_for(lambda: _task_starts(airflow, "set_block", "block"), "the blocking task to start")
    # Held stopped until the new priority is set: its 30 s sleep alone did not always outlive the
    # CLI calls below on a loaded machine, and then w1 ran first.
    os.kill(block["pid"], signal.SIGSTOP)
    try:
        run = airflow.trigger("set_waiters")
        wait_for(lambda: _team_s(airflow) == (1, 2, 2), "team-s to run the blocking task with both waiters pending")
        # Positions are those of the scheduler's last cycle: w2 may be first while w1 is not yet queued.
        wait_for(lambda: "position 2" in airflow.airflow("quota", "explain", "set_waiters", run, "w2").stdout,
                 "w2 to wait behind w1")
        out = airflow.airflow("quota", "set-priority", "set_waiters", run, "w2", "100").stdout
        assert "set to 100" in out
    finally:
        os.kill(block["pid"], signal.SIGCONT)
    # --all: w2 may have run and ended by now, and the active list no longer holds it.
    jobs = json.loads(airflow.airflow("quota", "jobs", "--all", "--output", "json").stdout)
    w2 = next(j for j in jobs if j["dag_id"] == "set_waiters" and j["task_id"] == "w2")
    assert w2["priority"] == 100
    assert airflow.wait_run("set_waiters", run) == "success"
    admitted = [e["task_id"] for e in airflow.events("admitted", dag_id="set_waiters")]
    assert admitted == ["w2", "w1"]
    assert len(airflow.events("priority_changed", dag_id="set_waiters")) == 1
    # Airflow's UI and API show the new priority too, not the DAG's.
    (weight,) = airflow.sql("SELECT priority_weight FROM task_instance WHERE dag_id='set_waiters' AND run_id=? "
                            "AND task_id='w2'", run)
    assert weight["priority_weight"] == 100


def test_max_preemptions_reached_fails_the_task_naming_the_limit(airflow):
    airflow.wait_dag("limit_preemptor")
    run_victim = airflow.trigger("limit_victim")
    wait_for(lambda: [r for r in airflow.task_records() if r.get("name") == "victim"], "the victim to start")
    run_pre = airflow.trigger("limit_preemptor")
    assert airflow.wait_run("limit_preemptor", run_pre) == "success"
    assert airflow.wait_run("limit_victim", run_victim) == "failed"
    ti = airflow.tis("limit_victim", run_victim)["victim"]
    assert ti["state"] == "failed" and ti["try_number"] == 1
    limit = airflow.events("preemption_limit_reached", dag_id="limit_victim")
    assert len(limit) == 1 and "max_preemptions is 0" in limit[0]["message"]
    logged = airflow.sql("SELECT extra FROM log WHERE dag_id='limit_victim' AND event='quota failed'")
    assert logged and "max_preemptions is 0" in logged[0]["extra"]


def test_jobs_that_can_never_run_fail_with_a_clear_message_while_others_run(airflow):
    run = airflow.trigger("reject")
    assert airflow.wait_run("reject", run) == "failed"
    tis = airflow.tis("reject", run)
    assert tis["fits"]["state"] == "success"
    assert tis["unknown_quota"]["state"] == "failed" and tis["too_many_gpus"]["state"] == "failed"
    assert tis["unknown_pool"]["state"] == "failed"
    messages = {r["task_id"]: r["extra"] for r in airflow.sql(
        "SELECT task_id, extra FROM log WHERE dag_id='reject' AND event='quota failed'")}
    assert "'no-such-team' is not one of" in messages["unknown_quota"] and "team-a" in messages["unknown_quota"]
    assert "5 GPUs" in messages["too_many_gpus"] and "team-r" in messages["too_many_gpus"]
    assert "pool: 'no-such-pool' is not one of the quotas" in messages["unknown_pool"] and "team-r" in messages["unknown_pool"]


def test_a_job_waiting_longer_than_task_queued_timeout_still_runs(airflow):
    run = airflow.trigger("queued_timeout")
    assert airflow.wait_run("queued_timeout", run) == "success"
    submitted = airflow.events("submitted", dag_id="queued_timeout")
    admitted = airflow.events("admitted", dag_id="queued_timeout")
    first_submit = min(e["at"] for e in submitted if e["task_id"] == "waiter")
    waiter_admit = next(e["at"] for e in admitted if e["task_id"] == "waiter")
    assert waiter_admit - first_submit > QUEUED_TIMEOUT_S
    ti = airflow.tis("queued_timeout", run)["waiter"]
    assert (ti["state"], ti["try_number"]) == ("success", 1)


def test_a_bad_quota_file_edit_keeps_the_last_good_configuration(airflow):
    good = airflow.quota_path.read_text()
    airflow.quota_path.write_text(good.replace("capacity: 4\n", "capacity: four\n", 1))
    try:
        rejected = wait_for(lambda: airflow.events("config_rejected"), "the edit to be rejected")
        assert "queues[0].capacity" in rejected[0]["message"]
        assert "keeping the last good configuration" in airflow.tail("scheduler", 200000)
        # A hostile edit (nested aliases standing for a billion values) is rejected the same way,
        # at once, rather than taking the scheduler's heartbeat for a minute and gigabytes.
        airflow.quota_path.write_text(billion_laughs())
        rejected = wait_for(lambda: airflow.events("config_rejected")[1:], "the hostile edit to be rejected")
        assert "more than 200000 values" in rejected[0]["message"]
        run = airflow.trigger("prio_high")  # team-p still exists: the old configuration is in force
        assert airflow.wait_run("prio_high", run) == "success"
    finally:
        airflow.quota_path.write_text(good)
    wait_for(lambda: airflow.events("config_loaded"), "the fixed file to be loaded")


def test_scheduler_killed_and_restarted_loses_nothing(airflow):
    # A preemption count of its own, so that this test does not depend on earlier ones preempting.
    _seed("INSERT INTO quota_preemption_count (dag_id, run_id, task_id, map_index, count, last_at) "
          "VALUES ('survive_restart', 'seeded', 'k-seeded', -1, 2, 1.0)", airflow)
    counts_before = [tuple(r) for r in airflow.sql("SELECT * FROM quota_preemption_count ORDER BY dag_id, task_id")]
    assert [r["count"] for r in airflow.sql("SELECT count FROM quota_preemption_count WHERE task_id='k-seeded'")] == [2]
    run = airflow.trigger("survive_restart")
    wait_for(lambda: len({r["name"] for r in airflow.task_records() if r.get("name", "").startswith("k")
                          and r["event"] == "start"}) >= 2, "two tasks to run")
    airflow.kill_scheduler(signal.SIGKILL)
    time.sleep(2)
    airflow.start_scheduler()
    assert airflow.wait_run("survive_restart", run, timeout=300) == "success"
    for task_id, ti in airflow.tis("survive_restart", run).items():
        assert (ti["state"], ti["try_number"]) == ("success", 1), task_id
    assert airflow.events("adopted", dag_id="survive_restart")
    # Airflow sees the task succeed before the executor sees its process end and frees its devices.
    wait_for(lambda: not airflow.sql("SELECT 1 FROM quota_job WHERE state IN ('pending','running','stopping')"),
             "every job's process to be gone")
    counts_after = [tuple(r) for r in airflow.sql("SELECT * FROM quota_preemption_count ORDER BY dag_id, task_id")]
    assert counts_after == counts_before
    _assert_no_device_held_twice(airflow.events())


def _seed(statement: str, airflow) -> None:
    con = sqlite3.connect(airflow.home / "airflow.db", timeout=30)
    try:
        with con:
            con.execute(statement)
    finally:
        con.close()


def test_a_preempted_command_that_escaped_and_ignores_sigterm_is_gone_before_its_gpu_is_reused(airflow):
    """The fault test: the victim's command started a child in a session of its own that ignores
    SIGTERM. Past the grace period nothing of the victim is alive, and only then does its GPU go to
    the preemptor (which looks for the escaped process as it starts)."""
    airflow.wait_dag("escape_high")
    run_low = airflow.trigger("escape_low")
    escaped = wait_for(lambda: [r for r in airflow.task_records() if r["event"] == "escaped"], "the command to escape",
                       on_timeout=lambda: airflow.tail("scheduler"))[0]
    run_high = airflow.trigger("escape_high")
    assert airflow.wait_run("escape_high", run_high) == "success"
    start = next(r for r in airflow.task_records() if r.get("dag_id") == "escape_high" and r["event"] == "start")
    assert start["escaped_pid"] == escaped["escaped_pid"]
    assert start["escaped_state"] in ("gone", "Z"), start
    assert start["devices"] == escaped["devices"]  # the queue's one GPU
    assert airflow.wait_run("escape_low", run_low) == "success"
    preempted = airflow.events("preempted", dag_id="escape_low")
    assert len(preempted) == 1 and start["t"] - preempted[0]["at"] >= 3  # after the grace period
    # Task logs go to their log files, not to the scheduler's console (every task logs this line).
    assert "::group::Pre Execute" not in airflow.tail("scheduler", 10**8)


def _assert_no_device_held_twice(events) -> None:
    """Replay the whole audit log: a device is admitted only while free, released only by its holder."""
    holder: dict[str, int] = {}
    for e in events:
        devices = [d for d in (e["devices"] or "").split(",") if d]
        if e["kind"] == "admitted":
            for d in devices:
                assert d not in holder, f"device {d} given to job {e['job_id']} while job {holder[d]} holds it"
                holder[d] = e["job_id"]
        elif e["kind"] == "released":
            for d in devices:
                assert holder.pop(d, None) == e["job_id"], f"device {d} released by job {e['job_id']}"
    assert not holder, f"devices still held after every task finished: {holder}"


def test_a_gang_runs_its_nodes_on_the_local_launchers_one_host_each_on_gpus_of_its_own(airflow):
    run = airflow.trigger("gang_local")
    assert airflow.wait_run("gang_local", run) == "success", airflow.tail("scheduler")
    nodes = sorted((r for r in airflow.task_records() if r["event"] == "gang_node"), key=lambda r: r["QUOTA_NODE_RANK"])
    assert [r["QUOTA_NODE_RANK"] for r in nodes] == ["0", "1"], nodes
    assert {(r["QUOTA_NNODES"], r["WORLD_SIZE"], r["MASTER_ADDR"], r["QUOTA_HOST"]) for r in nodes} == {("2", "4", "127.0.0.1", "local")}
    assert len({r["MASTER_PORT"] for r in nodes}) == 1 and nodes[0]["MASTER_PORT"].isdigit()
    devices = [set(r["CUDA_VISIBLE_DEVICES"].split(",")) for r in nodes]
    assert [len(d) for d in devices] == [2, 2] and not devices[0] & devices[1], devices
    assert nodes[0]["QUOTA_CHECKPOINT_DIR"] == nodes[1]["QUOTA_CHECKPOINT_DIR"], "one checkpoint directory for the gang"
    admitted = airflow.events("admitted", dag_id="gang_local")
    assert [(e["host"], e["message"].split("; ")[-1]) for e in admitted] == [("local", "node 0 of 2"), ("local", "node 1 of 2")]
    # Settled once its host has seen both nodes' processes end (a heartbeat or two after the task's success).
    wait_for(lambda: airflow.sql("SELECT state FROM quota_job WHERE dag_id='gang_local'")[0]["state"] == "finished",
             "the gang's job to be settled", timeout=60)
    released = airflow.events("released", dag_id="gang_local")
    assert sorted(d for e in released for d in e["devices"].split(",")) == sorted(d for n in devices for d in n)
