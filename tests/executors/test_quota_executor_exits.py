"""A victim's GPUs go to the job waiting for them as soon as its host records the victim's exit,
between the scheduler's heartbeats (``QuotaExecutor._settle_exits``, run by the exit watcher).

The real executor's cycle steps, the Celery launcher's launch table and a real Celery app (in-memory
broker) on a real (SQLite) database.
"""

from __future__ import annotations

import uuid

import pytest
from celery import Celery
from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from airflow.executors import workloads
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.celery_launcher import CeleryLauncher
from airflow_quota_provider.executors.quota_executor import QuotaExecutor
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.host import LaunchState, QuotaLaunch, launches, record_launch, register_host, start_launch, task_exited
from airflow_quota_provider.models.job import JobState, QuotaJob, devices_of

QUOTAS = (
    "queues:\n  - name: q\n    capacity: 1\n    quotas:\n"
    "      - {name: owner, capacity: 1}\n      - {name: borrower, capacity: 0}\n"
)


@pytest.fixture
def executor(executor_for, monkeypatch) -> QuotaExecutor:
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "a-test-secret-long-enough-for-hmac-sha512-" * 2)
    executor = executor_for(QUOTAS)
    executor.launcher = CeleryLauncher(app=Celery(broker="memory://"))
    return executor


def _task(db: Session, task_id: str, state: TaskInstanceState, quota: str) -> tuple[QuotaJob, workloads.ExecuteTask]:
    ti_id = uuid.uuid4()
    db.execute(insert(TaskInstance.__table__).values(
        id=ti_id, dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1, state=state, pool=quota,
    ))
    workload = workloads.ExecuteTask(
        token="", dag_rel_path="d.py", bundle_info={"name": "dags-folder", "version": None}, log_path=None,
        ti=workloads.TaskInstance(id=ti_id, task_id=task_id, dag_id="d", run_id="r", try_number=1,
                                  dag_version_id=uuid.uuid4(), map_index=-1, queue="default", pool_slots=1, priority_weight=1),
    )
    job = QuotaJob(dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1, quota=quota, queue_name="q",
                   gpus=1, submitted_at=0.0, workload=workload.model_dump_json(), ti_id=str(ti_id))
    db.add(job)
    db.flush()
    return job, workload


def _victim(db: Session, *, exited: bool) -> QuotaJob:
    """A borrower told to stop for the owner; its try has ended (up_for_reschedule) and, if
    ``exited``, its host has recorded that its task process is gone."""
    register_host("gpu-a", queues=["q"], devices=["0"], celery_name="celery@gpu-a", session=db)
    job, _ = _task(db, "victim", TaskInstanceState.UP_FOR_RESCHEDULE, "borrower")
    transitions.admit(job, host="gpu-a", devices=["0"], now=1.0, session=db)
    record_launch("quota-victim", job_id=job.id, host="gpu-a", session=db)
    start_launch("quota-victim", worker_pid=1, session=db)
    transitions.launched(job, "quota-victim")
    transitions.begin_stop(job, preemptor="owner", reason="reclaim", deadline=1e12, fail_message=None, session=db)
    if exited:
        task_exited("quota-victim", session=db)
    db.flush()
    return job


def _owner_waiting(db: Session) -> QuotaJob:
    job, _ = _task(db, "owner", TaskInstanceState.QUEUED, "owner")
    return job


def test_an_exit_recorded_between_heartbeats_launches_the_waiting_owner_at_once(db, executor):
    victim, owner = _victim(db, exited=True), _owner_waiting(db)

    assert executor._settle_exits(db)

    assert victim.state == JobState.PREEMPTED.value and devices_of(victim.id, session=db) == []
    db.refresh(owner)
    assert (owner.state, owner.host, devices_of(owner.id, session=db)) == (JobState.RUNNING.value, "gpu-a", ["0"])
    assert launches([owner.handle], session=db)[owner.handle].state == LaunchState.SENT.value, "published to gpu-a's queue"


def test_a_victim_still_running_is_left_stopping_and_its_owner_waiting(db, executor):
    victim, owner = _victim(db, exited=False), _owner_waiting(db)

    assert not executor._settle_exits(db)

    assert victim.state == JobState.STOPPING.value and devices_of(victim.id, session=db) == ["0"]
    assert owner.state == JobState.PENDING.value
    assert db.scalars(select(QuotaLaunch.handle).where(QuotaLaunch.job_id == owner.id)).all() == []


def test_a_preemption_starts_the_exit_watch_and_a_heartbeat_without_victims_ends_it(db, executor):
    _owner_waiting(db)
    _task(db, "borrowed", TaskInstanceState.RUNNING, "borrower")
    borrower = db.scalars(select(QuotaJob).where(QuotaJob.task_id == "borrowed")).one()
    register_host("gpu-a", queues=["q"], devices=["0"], celery_name="celery@gpu-a", session=db)
    transitions.admit(borrower, host="gpu-a", devices=["0"], now=1.0, session=db)
    db.flush()
    executor._begin_cycle(db)
    assert not executor._victims_stopping

    executor._schedule(db)  # the owner reclaims its GPU: the borrower is told to stop
    assert borrower.state == JobState.STOPPING.value
    assert executor._victims_stopping

    transitions.settle_stopped(borrower, requeued=False, session=db)
    db.flush()
    executor._enforce_deadlines(db)
    assert not executor._victims_stopping
