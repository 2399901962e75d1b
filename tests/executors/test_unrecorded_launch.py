"""A job admitted whose launch never reached its row (its scheduler stopped, or lost the database,
between committing the admission and noting the launch) does not hold its GPUs for ever: past
``launch_start_timeout_s`` it takes back the launch its host got, or goes back to its place.

The executor's reconciler and the Celery launcher's launch table on a real (SQLite) database.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert
from sqlalchemy.orm import Session

from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.celery_launcher import CeleryLauncher
from airflow_quota_provider.executors.cycle import Cycle
from airflow_quota_provider.executors.quota_executor import QuotaExecutor
from airflow_quota_provider.executors.reconcile import Reconciler
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.host import record_launch
from airflow_quota_provider.models.job import JobState, QuotaJob, devices_of

NOW = 10_000.0
TIMEOUT_S = 60.0
QUOTAS = "queues:\n  - name: q\n    capacity: 4\n    quotas:\n      - {name: team-a, capacity: 4}\n"


@pytest.fixture
def reconciler(executor_for, monkeypatch) -> Reconciler:
    monkeypatch.setenv("AIRFLOW__QUOTA__LAUNCH_START_TIMEOUT_S", str(TIMEOUT_S))
    executor: QuotaExecutor = executor_for(QUOTAS)
    executor._start_parts(CeleryLauncher(app=object()))  # only its launch table is read here
    return executor.reconciler


@pytest.fixture
def cycle(db, reconciler) -> Cycle:
    return Cycle(db, NOW, reconciler.config.quota_file, frozenset({"q"}))


def _admitted(db: Session, task_id: str, *, at: float) -> QuotaJob:
    """Admitted at ``at`` by a scheduler that stopped before it noted a launch."""
    db.execute(insert(TaskInstance.__table__).values(
        id=uuid.uuid4(), dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1,
        state=TaskInstanceState.QUEUED, pool="team-a",
    ))
    job = QuotaJob(dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1, quota="team-a",
                   queue_name="q", gpus=1, submitted_at=0.0, workload="{}")
    db.add(job)
    db.flush()
    transitions.admit(job, host="gpu-a", devices=[task_id[-1]], now=at, session=db)
    db.flush()
    return job


def test_an_admission_with_no_launch_anywhere_goes_back_to_its_place_after_the_timeout(db, reconciler, cycle):
    job = _admitted(db, "t0", at=NOW - TIMEOUT_S - 1)
    assert reconciler.recover_unrecorded_launches(cycle)
    assert (job.state, job.handle, devices_of(job.id, session=db)) == (JobState.PENDING.value, None, [])


def test_an_admission_whose_host_got_the_launch_takes_it_back(db, reconciler, cycle):
    job = _admitted(db, "t1", at=NOW - TIMEOUT_S - 1)
    record_launch("quota-1-old", job_id=job.id, host="gpu-a", session=db).sent_at = NOW - 2 * TIMEOUT_S  # an earlier run's
    record_launch("quota-1-late", job_id=job.id, host="gpu-a", session=db).sent_at = NOW - TIMEOUT_S
    assert reconciler.recover_unrecorded_launches(cycle)
    assert (job.state, job.handle) == (JobState.RUNNING.value, "quota-1-late")


def test_an_admission_still_within_the_timeout_is_left_to_the_scheduler_launching_it(db, reconciler, cycle):
    job = _admitted(db, "t2", at=NOW - 5)
    assert not reconciler.recover_unrecorded_launches(cycle)
    assert (job.state, job.handle) == (JobState.RUNNING.value, None)


def test_a_preempted_admission_with_no_launch_is_settled_back_in_line(db, reconciler, cycle):
    job = _admitted(db, "t3", at=NOW - TIMEOUT_S - 1)
    transitions.begin_stop(job, preemptor="urgent", reason="reclaim", deadline=NOW - TIMEOUT_S, fail_message=None, session=db)
    assert job.state == JobState.STOPPING.value
    assert reconciler.recover_unrecorded_launches(cycle)
    assert job.state not in (JobState.RUNNING.value, JobState.STOPPING.value)
    assert devices_of(job.id, session=db) == []
