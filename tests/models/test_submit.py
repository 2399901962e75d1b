"""Submitting: Airflow queued a job's task. A new job takes its place now; a known one keeps it (and
its priority) unless it had ended; a stopping or running one stays so until its process is gone."""

from __future__ import annotations

import pytest

from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.job import JobState, QuotaEvent, QuotaJob


def _submit(session, job: QuotaJob, *, now: float, priority: int = 5, workload: str = '{"new": 1}') -> None:
    transitions.submit(
        job, workload=workload, ti_id="ti", quota="team-a", gpus=2, priority=priority, preemptible=True,
        max_preemptions=None, grace_period_s=None, expected_runtime_s=None, now=now, session=session,
    )


def _job(task_id: str) -> QuotaJob:
    return QuotaJob(dag_id="dag", run_id="run", task_id=task_id, map_index=-1, try_number=1)


def _known(session, task_id: str, state: JobState) -> QuotaJob:
    job = _job(task_id)
    _submit(session, job, now=100.0, priority=7)
    job.state, job.workload, job.pending_reason = state.value, None, "earlier"
    return job


def test_a_new_job_takes_its_place_now(session):
    job = _job("new_job")
    _submit(session, job, now=100.0)
    assert (job.state, job.submitted_at, job.priority, job.workload, job.quota, job.gpus) == (
        "pending", 100.0, 5, '{"new": 1}', "team-a", 2
    )
    assert job.pending_reason == "waiting for the next scheduling cycle"
    assert [(e.kind, e.message) for e in session.query(QuotaEvent)] == [("submitted", "priority 5")]


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.PREEMPTED], ids=["revoked", "preempted"])
def test_a_waiting_job_queued_again_keeps_its_place_and_priority(session, state):
    job = _known(session, f"waiting_{state.value}", state)
    _submit(session, job, now=200.0, priority=1)
    assert (job.state, job.submitted_at, job.priority, job.workload) == ("pending", 100.0, 7, '{"new": 1}')
    assert job.pending_reason == "earlier"


@pytest.mark.parametrize("state", [JobState.FINISHED, JobState.FAILED])
def test_an_ended_job_queued_again_on_its_try_takes_a_new_place(session, state):
    job = _known(session, f"ended_{state.value}", state)
    job.report = "success"
    _submit(session, job, now=200.0, priority=1)
    assert (job.state, job.submitted_at, job.priority, job.report) == ("pending", 200.0, 1, None)


def test_a_stopping_job_queued_again_stays_stopping_until_its_process_is_gone(session):
    job = _known(session, "stopping_job", JobState.STOPPING)
    _submit(session, job, now=200.0)
    assert (job.state, job.workload) == ("stopping", '{"new": 1}')


def test_a_running_job_queued_again_stays_running_until_its_process_is_gone(session):
    """A sensor rescheduled or a deferred task resumed before its run's end was settled: refusing it
    would stop Airflow's scheduler, which queues it in its own transaction."""
    job = _known(session, "running_job", JobState.RUNNING)
    job.pending_reason = None
    _submit(session, job, now=200.0)
    assert (job.state, job.workload, job.submitted_at, job.pending_reason) == ("running", '{"new": 1}', 100.0, None)