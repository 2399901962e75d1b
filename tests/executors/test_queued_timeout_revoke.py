"""With ``[quota] keep_queued_alive = False`` Airflow's ``task_queued_timeout`` revokes a task that
waits for quota; the job keeps its place and its first submission time, and the task still runs on
the same try."""

from __future__ import annotations

import textwrap

from tests.integration_support import AirflowInstance, free_port

QUOTAS = """
queues:
  - name: q-wait
    capacity: 1
    quotas:
      - {name: team-w, capacity: 1}
"""

DAG = '''
import time
import pendulum
from airflow.sdk import DAG, task

with DAG("revoked_waiter", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    @task(task_id="hold", pool="team-w", priority_weight=10, weight_rule="absolute")
    def hold():
        time.sleep(45)

    @task(task_id="waiter", pool="team-w", priority_weight=1, weight_rule="absolute")
    def waiter():
        pass

    hold()
    waiter()
'''

QUEUED_TIMEOUT_S = 20
"""Well above the time from queued to running of a task admitted at once (``hold``), which took over
8 s in a full run on a busy 2-core machine: only the waiting task may reach it."""


def test_a_revoked_waiting_task_keeps_its_place_and_runs_on_the_same_try(tmp_path):
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "revoked_waiter.py").write_text(textwrap.dedent(DAG))
    airflow = AirflowInstance(
        tmp_path / "home",
        port=free_port(18040, 18049, also=50),
        quota_file=QUOTAS,
        dags_folder=dags,
        extra_env={
            "AIRFLOW__QUOTA__KEEP_QUEUED_ALIVE": "False",
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT_S),
        },
    )
    try:
        airflow.start()
        run = airflow.trigger("revoked_waiter")
        assert airflow.wait_run("revoked_waiter", run, timeout=240) == "success"
        revoked = airflow.events("revoked", dag_id="revoked_waiter")
        submitted = [e for e in airflow.events("submitted", dag_id="revoked_waiter") if e["task_id"] == "waiter"]
        (job,) = airflow.sql("SELECT submitted_at FROM quota_job WHERE task_id='waiter'")
        ti = airflow.tis("revoked_waiter", run)["waiter"]
    finally:
        airflow.stop()
    assert [e["task_id"] for e in revoked] and {e["task_id"] for e in revoked} == {"waiter"}
    assert all(e["message"] == "task_queued_timeout; place kept" for e in revoked)
    assert len(submitted) == len(revoked) + 1, "queued again after each revoke, to the same job"
    assert abs(job["submitted_at"] - submitted[0]["at"]) < 1.0, "its place: the first submission time"
    assert (ti["state"], ti["try_number"]) == ("success", 1)
