"""Estimated start times forecast in a background thread and written to the waiting jobs' rows."""

from __future__ import annotations

import logging

from airflow_quota_provider.executors.estimates import StartEstimates
from airflow_quota_provider.models.job import JobState, QuotaJob
from airflow_quota_provider.models.transitions import admit
from tests.executors.conftest import Clock
from tests.policy.builders import StateBuilder

NOW = 1000.0
LOG = logging.getLogger(__name__)


def _row(session, task_id: str, state: JobState) -> QuotaJob:
    job = QuotaJob(dag_id="dag", run_id="run", task_id=task_id, quota="a", gpus=4, priority=0, state=state.value,
                   submitted_at=900.0, started_at=900.0 if state != JobState.PENDING else None, workload="{}")
    session.add(job)
    session.flush()
    return job


def _state(running_id: str, waiting_id: str, runtime: float):
    return (
        StateBuilder(4)
        .quota("a", 4)
        .run(running_id, "a", 4, started_at=900.0, expected_runtime_s=runtime)
        .wait(waiting_id, "a", 4, submitted_at=950.0, expected_runtime_s=60.0)
        .build()
    )


def _estimate(session, job: QuotaJob) -> float | None:
    session.expire_all()
    return session.get(QuotaJob, job.id).estimated_start_at


def test_a_forecast_writes_the_waiting_jobs_estimates_and_only_theirs(db):
    clock = Clock()
    running, waiting = _row(db, "running", JobState.RUNNING), _row(db, "waiting", JobState.PENDING)
    estimates = StartEstimates(30.0, LOG, clock)
    # The running job's id is given as waiting too: a row no longer pending is never written.
    state = _state(running.job_id, waiting.job_id, runtime=400.0)
    assert estimates.submit({"q": state}, NOW)
    estimates.wait(10)
    assert estimates.write(NOW, session=db) == 1
    assert _estimate(db, waiting) == 1300.0
    assert _estimate(db, running) is None


def test_forecasts_run_at_most_every_interval_and_rewrite_only_what_moved(db):
    clock = Clock()
    waiting = _row(db, "waiting", JobState.PENDING)
    estimates = StartEstimates(30.0, LOG, clock)
    state = _state("r", waiting.job_id, runtime=400.0)
    assert estimates.submit({"q": state}, NOW)
    assert not estimates.submit({"q": state}, NOW)  # one at a time
    estimates.wait(10)
    estimates.write(NOW, session=db)
    clock.now = 29.0
    assert not estimates.submit({"q": state}, NOW)  # under the interval
    clock.now = 31.0
    assert estimates.submit({"q": _state("r", waiting.job_id, runtime=410.0)}, NOW)
    estimates.wait(10)
    assert estimates.write(NOW, session=db) == 0  # 10 s later: within the tolerance
    assert _estimate(db, waiting) == 1300.0
    clock.now = 62.0
    assert estimates.submit({"q": _state("r", waiting.job_id, runtime=4000.0)}, NOW)
    estimates.wait(10)
    assert estimates.write(NOW, session=db) == 1
    assert 4900.0 <= _estimate(db, waiting) <= 4900.0 + 0.05 * 3900.0  # on the forecast's grid


def test_interval_zero_never_forecasts():
    estimates = StartEstimates(0.0, LOG, Clock())
    assert not estimates.submit({"q": _state("r", "w", runtime=400.0)}, NOW)


def test_a_job_that_starts_forgets_its_estimate(db):
    job = _row(db, "waiting", JobState.PENDING)
    job.estimated_start_at = 1300.0
    admit(job, host="h", devices=["0"], now=NOW, session=db)
    assert job.estimated_start_at is None and job.to_dict()["estimated_start_at"] is None
