"""Expected runtimes from a task's history, and checkpoint times from its checkpoint directory."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import insert

from airflow_quota_provider.executors.runtimes import (
    CHECKPOINT_REFRESH_S,
    HISTORY_REFRESH_S,
    CheckpointTimes,
    RuntimeHistory,
    expected_runtime,
)
from tests.executors.conftest import Clock


@pytest.mark.parametrize(
    ("override", "durations", "timeout", "want"),
    [
        pytest.param(600, [10.0, 20.0], 3600.0, 600.0, id="the task's declaration wins over its history"),
        pytest.param(None, [10.0, 30.0, 20.0], 3600.0, 20.0, id="else the median of its recent successful durations"),
        pytest.param(None, [10.0, 20.0], None, 15.0, id="an even count takes the mean of the middle two"),
        pytest.param(None, [], 3600.0, 3600.0, id="without history its execution_timeout"),
        pytest.param(None, [], None, None, id="without either it is unknown"),
        pytest.param(-5, [10.0], None, 10.0, id="a declaration that is not a positive number is ignored"),
        pytest.param(True, [], None, None, id="a boolean is no declaration"),
    ],
)
def test_expected_runtime(override, durations, timeout, want):
    assert expected_runtime(override, durations, timeout) == want


def add_ti(session, task_id: str, state: str, duration: float | None, *, map_index: int = -1, ended: int = 0) -> None:
    from airflow.models.taskinstance import TaskInstance

    end = datetime(2026, 1, 1, tzinfo=timezone.utc) + timedelta(minutes=ended)
    session.execute(insert(TaskInstance.__table__).values(
        id=uuid.uuid4(), dag_id="train", run_id=f"run-{uuid.uuid4()}", task_id=task_id, map_index=map_index,
        try_number=1, state=state, duration=duration, end_date=end, pool="team-a", pool_slots=1,
        priority_weight=1, max_tries=0, hostname="", unixname="", queue="default", executor_config=b"",
        custom_operator_name="", span_status="not_started", dag_version_id=uuid.uuid4(),
    ))


def test_the_history_pools_map_indexes_and_counts_only_successes(db):
    add_ti(db, "fit", "success", 100.0, map_index=0)
    add_ti(db, "fit", "success", 300.0, map_index=1)
    add_ti(db, "fit", "success", 200.0, map_index=2)
    add_ti(db, "fit", "failed", 5.0, map_index=3)
    add_ti(db, "other", "success", 9999.0)
    assert RuntimeHistory().expected("train", "fit", None, session=db) == 200.0


def test_the_history_is_read_once_per_task_until_it_is_stale(db):
    clock = Clock()
    history = RuntimeHistory(clock)
    add_ti(db, "fit", "success", 100.0)
    assert history.expected("train", "fit", None, session=db) == 100.0
    add_ti(db, "fit", "success", 300.0, ended=1)
    assert history.expected("train", "fit", None, session=db) == 100.0, "cached"
    clock.now = HISTORY_REFRESH_S
    assert history.expected("train", "fit", None, session=db) == 200.0


def test_a_checkpoint_counts_only_when_written_since_the_job_started(tmp_path):
    clock = Clock()
    times = CheckpointTimes(lambda *ti: tmp_path, clock)
    ti = ("train", "run", "fit", -1)
    assert times.last_at(1, ti, 0.0) is None, "no checkpoint yet"
    checkpoint = tmp_path / "ckpt-001.pt"
    checkpoint.write_text("x")
    os.utime(checkpoint, (1000.0, 1000.0))
    assert times.last_at(1, ti, 0.0) is None, "looked at again only after the refresh interval"
    clock.now = CHECKPOINT_REFRESH_S
    assert times.last_at(1, ti, 500.0) == 1000.0
    assert times.last_at(1, ti, 1500.0) is None, "saved before this run started: nothing of this run"
    (tmp_path / "ckpt-002.pt.tmp").write_text("in progress")
    clock.now = 2 * CHECKPOINT_REFRESH_S
    assert times.last_at(1, ti, 500.0) == 1000.0, "writes in progress are no checkpoint"


def test_a_task_without_a_local_checkpoint_directory_has_no_checkpoint_time():
    assert CheckpointTimes(lambda *ti: None).last_at(1, ("d", "r", "t", -1), 0.0) is None


def write_serialized_dag(session, *timeouts: tuple[str, timedelta | None]) -> None:
    """DAG ``train`` with a task per (task_id, execution_timeout), serialized as the dag-processor does."""
    import pendulum

    from airflow.models.dag import DagModel
    from airflow.models.dagbundle import DagBundleModel
    from airflow.models.serialized_dag import SerializedDagModel
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG
    from airflow.serialization.serialized_objects import LazyDeserializedDAG

    with DAG("train", schedule=None, start_date=pendulum.datetime(2026, 1, 1)) as dag:
        for task_id, timeout in timeouts:
            EmptyOperator(task_id=task_id, execution_timeout=timeout)
    session.add(DagBundleModel(name="dags-folder"))
    session.add(DagModel(dag_id="train", bundle_name="dags-folder"))
    session.flush()
    SerializedDagModel.write_dag(LazyDeserializedDAG.from_dag(dag), bundle_name="dags-folder", session=session)


def test_without_history_the_timeouts_of_all_a_dags_tasks_come_from_one_read_of_it(db):
    from airflow.models.serialized_dag import SerializedDagModel

    clock = Clock()
    history = RuntimeHistory(clock)
    write_serialized_dag(db, ("fit", timedelta(minutes=30)), ("eval", timedelta(minutes=10)), ("plot", None))
    assert history.expected("train", "fit", None, session=db) == 1800.0
    db.query(SerializedDagModel).delete()
    assert history.expected("train", "eval", None, session=db) == 600.0, "the DAG was read once for all its tasks"
    assert history.expected("train", "plot", None, session=db) is None, "no timeout set"
    clock.now = HISTORY_REFRESH_S
    assert history.expected("train", "fit", None, session=db) is None, "read again when stale: the DAG is gone"
