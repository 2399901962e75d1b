"""Reports reach Airflow at least once: Airflow drops an executor event whose task instance another
transaction holds locked (``skip_locked``), so a report stays until the task instance leaves the try.

The real executor's reports, from its reconciler, over a real database (SQLite, Airflow's ``task_instance`` table
beside the provider's); Airflow dropping the event is what it does, popping the event buffer.
"""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session, lazyload

from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors import reconcile
from airflow_quota_provider.executors.celery_launcher import CeleryLauncher
from airflow_quota_provider.executors.cycle import Cycle
from airflow_quota_provider.executors.quota_executor import QuotaExecutor
from airflow_quota_provider.models.job import JobState, QuotaJob, Report
from tests.executors.conftest import Clock

SCHEDULER_JOB = 7
QUOTAS = "queues:\n  - name: q\n    capacity: 1\n    quotas:\n      - {name: team-a, capacity: 1}\n"


@pytest.fixture
def executor(executor_for) -> QuotaExecutor:
    executor = executor_for(QUOTAS)
    executor.job_id = SCHEDULER_JOB
    executor._start_parts(CeleryLauncher(app=object()))  # reports read no launcher
    return executor


def _report(executor: QuotaExecutor, db: Session) -> None:
    """One cycle's reports, told to Airflow as the executor's ``sync`` does."""
    cycle = Cycle.begin(db, executor.quota_file, executor.job_id)
    executor._tell_airflow(executor.reconciler.reports(cycle))


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock(time.monotonic())
    monkeypatch.setattr(reconcile, "time", clock)
    return clock


def _killed_before_it_started(db: Session, *, queued_by: int = SCHEDULER_JOB) -> QuotaJob:
    """A task whose process was killed while its task instance was still queued."""
    db.execute(
        insert(TaskInstance.__table__).values(
            id=uuid.uuid4(), dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1,
            state=TaskInstanceState.QUEUED, pool="team-a", queued_by_job_id=queued_by,
        )
    )
    job = QuotaJob(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1, quota="team-a", queue_name="q",
                   gpus=1, submitted_at=0.0, state=JobState.FINISHED.value, report=Report.FAILED.value)
    db.add(job)
    db.flush()
    return job


def _ti_to(db: Session, state: TaskInstanceState) -> None:
    db.execute(update(TaskInstance.__table__).values(state=state))


def test_a_report_airflow_dropped_is_sent_again_until_the_task_instance_leaves_the_try(db, executor, clock):
    job = _killed_before_it_started(db)
    _report(executor, db)
    (key,) = executor.get_event_buffer()  # Airflow pops every event, and drops this one (row locked)
    assert key.task_id == "t" and key.try_number == 1

    _report(executor, db)
    assert executor.get_event_buffer() == {}, "not every heartbeat"
    assert job.report == Report.FAILED.value, "kept: the task instance is still queued"

    clock.now += reconcile.REPORT_AGAIN_S
    _report(executor, db)
    assert [state for state, _ in executor.get_event_buffer().values()] == [TaskInstanceState.FAILED]

    _ti_to(db, TaskInstanceState.FAILED)  # Airflow acted on it
    clock.now += reconcile.REPORT_AGAIN_S
    _report(executor, db)
    executor.get_event_buffer()
    assert job.report is None
    clock.now += reconcile.REPORT_AGAIN_S
    _report(executor, db)
    assert executor.get_event_buffer() == {}, "settled: never sent again"


def test_a_report_whose_task_instance_already_ended_is_sent_once(db, executor, clock):
    job = _killed_before_it_started(db)
    job.report = Report.SUCCESS.value
    _ti_to(db, TaskInstanceState.SUCCESS)  # the task said so itself before its process ended
    _report(executor, db)
    assert [state for state, _ in executor.get_event_buffer().values()] == [TaskInstanceState.SUCCESS]
    assert job.report is None


def test_a_gone_schedulers_report_waits_for_the_scheduler_that_adopts_its_task_instance(db, executor, clock):
    """Airflow ignores an event from a scheduler that did not queue the task: taken by any other,
    the report would be lost, and the adopter would see nothing to report."""
    job = _killed_before_it_started(db, queued_by=SCHEDULER_JOB + 1)
    _report(executor, db)
    assert executor.get_event_buffer() == {}
    assert job.report == Report.FAILED.value


def test_airflow_revoking_a_task_whose_job_ended_while_it_was_queued_leaves_the_report_to_tell_it(db, executor):
    """Airflow's ``task_queued_timeout`` can come before it heeds the report of a task whose process
    ended before it started; a revoke of such a job raised, which stops Airflow's scheduler."""
    job = _killed_before_it_started(db)
    ti = db.scalar(select(TaskInstance).options(lazyload("*")))  # no dag run here to join
    executor.revoke_task(ti=ti)
    assert (job.state, job.report) == (JobState.FINISHED.value, Report.FAILED.value)
