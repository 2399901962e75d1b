"""Reports reach Airflow at least once: Airflow drops an executor event whose task instance another
transaction holds locked (``skip_locked``), so a report stays until the task instance leaves the try.

The real executor's reconcile step over a real database (SQLite, Airflow's ``task_instance`` table
beside the provider's); Airflow dropping the event is what it does, popping the event buffer.
"""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import create_engine, insert, update
from sqlalchemy.orm import Session

from airflow.jobs.job import Job
from airflow.models import import_all_models
from airflow.models.base import Base
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors import reconcile
from airflow_quota_provider.executors.quota_executor import QuotaExecutor
from airflow_quota_provider.models.base import quota_metadata
from airflow_quota_provider.models.job import JobState, QuotaJob, Report

SCHEDULER_JOB = 7
QUOTAS = "queues:\n  - name: q\n    capacity: 1\n    quotas:\n      - {name: team-a, capacity: 1}\n"


@pytest.fixture
def session():
    import_all_models()
    engine = create_engine("sqlite://")
    quota_metadata.create_all(engine)
    Base.metadata.create_all(engine, tables=[TaskInstance.__table__, Job.__table__])
    with Session(engine) as s:
        yield s


@pytest.fixture
def executor(tmp_path, monkeypatch) -> QuotaExecutor:
    (tmp_path / "quotas.yaml").write_text(QUOTAS)
    monkeypatch.setenv("AIRFLOW__QUOTA__QUOTA_FILE", str(tmp_path / "quotas.yaml"))
    executor = QuotaExecutor()
    executor.job_id = SCHEDULER_JOB
    return executor


class Clock:
    def __init__(self) -> None:
        self.now = time.monotonic()

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(reconcile, "time", clock)
    return clock


def _killed_before_it_started(session: Session, *, queued_by: int = SCHEDULER_JOB) -> QuotaJob:
    """A task whose process was killed while its task instance was still queued."""
    session.execute(
        insert(TaskInstance.__table__).values(
            id=uuid.uuid4(), dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1,
            state=TaskInstanceState.QUEUED, pool="team-a", queued_by_job_id=queued_by,
        )
    )
    job = QuotaJob(dag_id="d", run_id="r", task_id="t", map_index=-1, try_number=1, quota="team-a", queue_name="q",
                   gpus=1, submitted_at=0.0, state=JobState.FINISHED.value, report=Report.FAILED.value)
    session.add(job)
    session.flush()
    return job


def _ti_to(session: Session, state: TaskInstanceState) -> None:
    session.execute(update(TaskInstance.__table__).values(state=state))


def test_a_report_airflow_dropped_is_sent_again_until_the_task_instance_leaves_the_try(session, executor, clock):
    job = _killed_before_it_started(session)
    executor._report(session)
    (key,) = executor.get_event_buffer()  # Airflow pops every event, and drops this one (row locked)
    assert key.task_id == "t" and key.try_number == 1

    executor._report(session)
    assert executor.get_event_buffer() == {}, "not every heartbeat"
    assert job.report == Report.FAILED.value, "kept: the task instance is still queued"

    clock.now += reconcile.REPORT_AGAIN_S
    executor._report(session)
    assert [state for state, _ in executor.get_event_buffer().values()] == [TaskInstanceState.FAILED]

    _ti_to(session, TaskInstanceState.FAILED)  # Airflow acted on it
    clock.now += reconcile.REPORT_AGAIN_S
    executor._report(session)
    executor.get_event_buffer()
    assert job.report is None
    clock.now += reconcile.REPORT_AGAIN_S
    executor._report(session)
    assert executor.get_event_buffer() == {}, "settled: never sent again"


def test_a_report_whose_task_instance_already_ended_is_sent_once(session, executor, clock):
    job = _killed_before_it_started(session)
    job.report = Report.SUCCESS.value
    _ti_to(session, TaskInstanceState.SUCCESS)  # the task said so itself before its process ended
    executor._report(session)
    assert [state for state, _ in executor.get_event_buffer().values()] == [TaskInstanceState.SUCCESS]
    assert job.report is None


def test_a_gone_schedulers_report_waits_for_the_scheduler_that_adopts_its_task_instance(session, executor, clock):
    """Airflow ignores an event from a scheduler that did not queue the task: taken by any other,
    the report would be lost, and the adopter would see nothing to report."""
    job = _killed_before_it_started(session, queued_by=SCHEDULER_JOB + 1)
    executor._report(session)
    assert executor.get_event_buffer() == {}
    assert job.report == Report.FAILED.value
