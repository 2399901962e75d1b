"""State-change functions of the quota tables, on their own SQLite database."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import IntegrityError

from airflow_quota_provider.models.job import (
    EventKind,
    JobNotFound,
    JobState,
    QuotaJob,
    allocate_devices,
    allocated_devices,
    count_preemption,
    explain,
    list_jobs,
    preemption_count,
    record_event,
    release_devices,
    set_priority,
)
from airflow_quota_provider.policy import parse_quota_file


CAPPED = parse_quota_file(
    {"queues": [{"name": "fleet", "capacity": 4, "quotas": [{"name": "team-a", "capacity": 4, "max_priority": 100}]}]}
)


def _job(session, task_id: str, state: JobState = JobState.PENDING, **kw) -> QuotaJob:
    job = QuotaJob(dag_id="dag", run_id="run", task_id=task_id, map_index=-1, try_number=1, quota="team-a",
                   gpus=1, priority=5, preemptible=True, state=state.value, submitted_at=100.0, **kw)
    session.add(job)
    session.flush()
    return job


def test_set_priority_changes_a_waiting_job_and_records_it(session):
    job = _job(session, "waiting_job")
    set_priority("dag", "run", "waiting_job", 70, by="alice (CLI)", session=session)
    assert job.priority == 70
    events = explain("dag", "run", "waiting_job", session=session)["events"]
    assert [(e["kind"], e["message"]) for e in events] == [("priority_changed", "priority 5 -> 70 by alice (CLI)")]


def test_set_priority_above_max_priority_names_the_field(session):
    _job(session, "capped_job")
    with pytest.raises(ValueError, match="priority: 101 is above quota team-a's max_priority 100"):
        set_priority("dag", "run", "capped_job", 101, quota_file=CAPPED, session=session)


def test_set_priority_of_a_finished_job_is_not_found(session):
    _job(session, "finished_job", JobState.FINISHED)
    with pytest.raises(JobNotFound, match="no active job for dag_id=dag run_id=run task_id=finished_job"):
        set_priority("dag", "run", "finished_job", 1, session=session)


def test_a_device_cannot_be_held_by_two_jobs(session):
    first = _job(session, "first_holder", JobState.RUNNING)
    second = _job(session, "second_holder", JobState.RUNNING)
    allocate_devices(first, "gpu-a", ["0", "1"], session=session)
    with pytest.raises(IntegrityError):
        allocate_devices(second, "gpu-a", ["1"], session=session)


def test_the_same_index_on_two_hosts_is_two_devices(session):
    first = _job(session, "on_host_a", JobState.RUNNING)
    second = _job(session, "on_host_b", JobState.RUNNING)
    allocate_devices(first, "gpu-a", ["0"], session=session)
    allocate_devices(second, "gpu-b", ["0"], session=session)
    assert allocated_devices(session=session) == {("gpu-a", "0"): first.id, ("gpu-b", "0"): second.id}


def test_release_frees_devices_and_logs_them(session):
    job = _job(session, "released_job", JobState.RUNNING, host="gpu-a")
    allocate_devices(job, "gpu-a", ["3", "2"], session=session)
    assert release_devices(job, session=session) == ["2", "3"]
    assert release_devices(job, session=session) == []
    event = explain("dag", "run", "released_job", session=session)["events"][0]
    assert (event["host"], event["devices"]) == ("gpu-a", "2,3")


def test_preemption_counts_survive_new_tries(session):
    job = _job(session, "preempted_twice")
    assert count_preemption(job, session=session) == 1
    retry = QuotaJob(dag_id="dag", run_id="run", task_id="preempted_twice", map_index=-1, try_number=2,
                     quota="team-a", gpus=1, priority=5, preemptible=True, state="pending", submitted_at=1.0)
    session.add(retry)
    session.flush()
    assert count_preemption(retry, session=session) == 2
    assert preemption_count("dag", "run", "preempted_twice", session=session) == 2


def test_list_jobs_defaults_to_active_states(session):
    _job(session, "active_job", JobState.RUNNING)
    _job(session, "done_job", JobState.FINISHED)
    assert [j.task_id for j in list_jobs(session=session)] == ["active_job"]
    record_event(EventKind.ADMITTED, session=session, devices="0")
    assert len(list_jobs(states=list(JobState), session=session)) == 2
