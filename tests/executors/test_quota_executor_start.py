"""QuotaExecutor refuses to start a real scheduler with a bad quota file, naming the field."""

from __future__ import annotations

from pathlib import Path

from tests.integration_support import AirflowInstance, free_port

BAD = """
queues:
  - name: fleet
    capacity: 4
    quotas:
      - {name: team-a, capacity: 2, sharing: share_everything}
"""


def test_bad_quota_file_at_start_is_refused_with_the_field_named(tmp_path):
    instance = AirflowInstance(tmp_path / "home", port=free_port(18040, 18049, also=50), quota_file=BAD, dags_folder=tmp_path / "dags")
    (tmp_path / "dags").mkdir()
    instance.airflow("db", "migrate")
    result = instance.airflow("scheduler", check=False, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "queues[0].quotas[0].sharing" in output and "lend_and_borrow" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_a_quota_named_like_a_pool_the_executor_does_not_manage_is_refused(tmp_path):
    quotas = "queues:\n  - name: fleet\n    capacity: 2\n    quotas:\n      - {name: etl-pool, capacity: 2}\n"
    instance = AirflowInstance(tmp_path / "home", port=free_port(18040, 18049, also=50), quota_file=quotas, dags_folder=tmp_path / "dags")
    (tmp_path / "dags").mkdir()
    instance.airflow("db", "migrate")
    instance.airflow("pools", "set", "etl-pool", "3", "for the ETL DAGs")
    result = instance.airflow("scheduler", check=False, timeout=180)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "queues[0].quotas[0].name: 'etl-pool' is an Airflow pool that QuotaExecutor does not manage" in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    slots = instance.sql("SELECT slots FROM slot_pool WHERE pool='etl-pool'")
    assert [r["slots"] for r in slots] == [3]  # not made unlimited
