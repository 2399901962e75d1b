"""One real Airflow shared by the executor integration tests (see tests/integration_support.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from airflow_quota_provider.models.base import quota_metadata
from tests.integration_support import AirflowInstance, free_port

DAGS = Path(__file__).parent / "dags"

QUOTAS = """
queues:
  - name: q-borrow
    capacity: 4
    quotas:
      - {name: team-a, capacity: 2, grace_period_s: 6}
      - {name: team-b, capacity: 2, grace_period_s: 6}
  - name: q-prio
    capacity: 1
    quotas:
      - {name: team-p, capacity: 1, grace_period_s: 3}
  - name: q-set
    capacity: 1
    quotas:
      - {name: team-s, capacity: 1, preemption: {within_quota: never}}
  - name: q-limit
    capacity: 1
    quotas:
      - {name: team-l, capacity: 1, grace_period_s: 3, max_preemptions: 0}
  - name: q-rej
    capacity: 1
    quotas:
      - {name: team-r, capacity: 1, sharing: reserve}
  - name: q-wait
    capacity: 1
    quotas:
      - {name: team-w, capacity: 1}
  - name: q-kill
    capacity: 2
    quotas:
      - {name: team-k, capacity: 2}
  - name: q-escape
    capacity: 1
    quotas:
      - {name: team-e, capacity: 1, grace_period_s: 3}
  - name: q-usage
    capacity: 3
    quotas:
      - {name: usage-a, capacity: 1, grace_period_s: 2}
      - {name: usage-b, capacity: 2, grace_period_s: 2}
  - name: q-gang
    capacity: 4
    quotas:
      - {name: team-g, capacity: 4}
"""

QUEUED_TIMEOUT_S = 8


@pytest.fixture(scope="session")
def airflow(tmp_path_factory) -> AirflowInstance:
    instance = AirflowInstance(
        tmp_path_factory.mktemp("airflow-quota"),
        port=free_port(18010, 18039, also=50),
        quota_file=QUOTAS,
        dags_folder=DAGS,
        extra_env={
            "AIRFLOW__QUOTA__VIRTUAL_GPUS": "19",  # the queues' capacities, in file order,
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": str(QUEUED_TIMEOUT_S),
        },
    )
    try:
        instance.start()
        yield instance
    finally:
        instance.stop()


class Clock:
    """A clock the test moves: called, or as a ``time`` module's ``monotonic()``."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def db():
    """Airflow's tables and the provider's in one in-memory SQLite database (foreign keys not
    enforced: task instances without their runs)."""
    from airflow.models import import_all_models
    from airflow.models.taskinstance import TaskInstance

    import_all_models()
    engine = create_engine("sqlite://")
    TaskInstance.metadata.create_all(engine)
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        yield session


@pytest.fixture
def executor_for(tmp_path, monkeypatch):
    """A real QuotaExecutor made in this process over a quota file with the given text."""

    def make(quotas: str):
        from airflow_quota_provider.executors.quota_executor import QuotaExecutor

        (tmp_path / "quotas.yaml").write_text(quotas)
        monkeypatch.setenv("AIRFLOW__QUOTA__QUOTA_FILE", str(tmp_path / "quotas.yaml"))
        return QuotaExecutor()

    return make
