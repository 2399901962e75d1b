"""QuotaExecutor in a real Airflow 3.3 (scheduler, dag-processor, api-server on SQLite)."""

from __future__ import annotations

import pytest

from tests.integration_support import wait_for


def _started(airflow, name_prefix: str, count: int):
    starts = [r for r in airflow.task_records() if r["event"] == "start" and r.get("name", r.get("task_id", "")).startswith(name_prefix)]
    return starts if len(starts) >= count else None


def test_borrow_then_reclaim_resumes_without_using_a_retry(airflow):
    airflow.wait_dag("reclaim_a")
    run_b = airflow.trigger("borrow_b")
    # team-b has 2 GPUs of its own: all four of its tasks run, two of them on team-a's idle GPUs.
    wait_for(lambda: _started(airflow, "b", 4), "four team-b tasks running", timeout=150,
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
    counts = airflow.sql("SELECT task_id, count FROM quota_preemption_count WHERE dag_id='borrow_b'")
    assert {r["task_id"]: r["count"] for r in counts} == {v: 1 for v in victims}
    # team-a started only on GPUs its victims had released, within the grace period.
    for e in airflow.events("preempted", dag_id="borrow_b"):
        stopped = [s for s in airflow.events("stopped", dag_id="borrow_b") if s["job_id"] == e["job_id"]]
        assert stopped and stopped[0]["at"] - e["at"] <= 6 + 5, (dict(e), [dict(s) for s in stopped])
