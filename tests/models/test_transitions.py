"""Job state changes: each moves one job from the states it applies to, writes its devices and
audit event, and refuses any other state naming the job and the state."""

from __future__ import annotations

import pytest

from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.host import (
    HostState,
    LaunchState,
    cancel_launches,
    end_dead_launches,
    end_launch,
    heartbeat_host,
    launches,
    mark_lost_hosts,
    record_launch,
    register_host,
    rejoin_host,
    start_launch,
)
from airflow_quota_provider.models.job import (
    JobState,
    QuotaEvent,
    QuotaJob,
    allocated_devices,
    preemption_count,
)


def _job(session, task_id: str, state: JobState = JobState.PENDING, **kw) -> QuotaJob:
    job = QuotaJob(dag_id="dag", run_id="run", task_id=task_id, map_index=-1, try_number=1, quota="team-a",
                   gpus=2, priority=5, preemptible=True, state=state.value, submitted_at=100.0, workload="{}", **kw)
    session.add(job)
    session.flush()
    return job


def _kinds(session) -> list[tuple[str, str | None]]:
    return [(e.kind, e.host) for e in session.query(QuotaEvent).order_by(QuotaEvent.id)]


def test_admit_takes_devices_on_its_host_and_records_them(session):
    job = _job(session, "admitted_job")
    transitions.admit(job, host="gpu-a", devices=["0", "1"], now=200.0, session=session)
    assert (job.state, job.host, job.started_at) == ("running", "gpu-a", 200.0)
    assert allocated_devices(session=session) == {("gpu-a", "0"): job.id, ("gpu-a", "1"): job.id}
    assert _kinds(session) == [("admitted", "gpu-a")]


def test_a_running_job_cannot_be_admitted_again(session):
    job = _job(session, "already_running", JobState.RUNNING)
    with pytest.raises(transitions.InvalidTransition, match=r"cannot admit job \d+ \(dag.already_running run try 1\): it is running, not pending"):
        transitions.admit(job, host="gpu-a", devices=["0"], now=1.0, session=session)


def test_a_stopped_job_goes_back_to_its_place_and_counts_one_preemption(session):
    job = _job(session, "stopped_job")
    transitions.admit(job, host="gpu-a", devices=["0", "1"], now=200.0, session=session)
    transitions.launched(job, "handle-1")
    transitions.begin_stop(job, preemptor="9", reason="reclaim", deadline=300.0, fail_message=None, session=session)
    assert transitions.settle_stopped(job, requeued=False, session=session) == 1
    assert (job.state, job.handle, job.submitted_at, job.workload) == ("preempted", None, 100.0, None)
    assert allocated_devices(session=session) == {}
    assert [k for k, _ in _kinds(session)] == ["admitted", "preempted", "reclaimed", "released", "stopped"]


def test_an_evicted_job_is_not_counted_as_preempted(session):
    job = _job(session, "evicted_job")
    transitions.admit(job, host="gpu-c", devices=["0", "1"], now=200.0, session=session)
    transitions.evict(job, requeued=True, why="host gpu-c lost", session=session)
    assert (job.state, job.workload) == ("pending", "{}")
    assert preemption_count("dag", "run", "evicted_job", session=session) == 0
    assert _kinds(session)[-1] == ("evicted", "gpu-c")


def test_only_a_stopping_job_can_settle_a_stop(session):
    job = _job(session, "not_stopping", JobState.RUNNING)
    with pytest.raises(transitions.InvalidTransition, match="it is running, not stopping"):
        transitions.settle_stopped(job, requeued=True, session=session)


def test_a_finished_job_cannot_be_revoked(session):
    job = _job(session, "done_job", JobState.FINISHED)
    with pytest.raises(transitions.InvalidTransition, match="cannot revoke .* it is finished, not pending or running or stopping or preempted"):
        transitions.revoke(job, session=session)


def test_a_silent_host_is_lost_and_comes_back_only_when_it_rejoins(session):
    host = register_host("gpu-a", queues=["fleet"], devices=["0", "1"], celery_name="celery@gpu-a", session=session)
    host.heartbeat_at = 100.0
    assert [h.name for h in mark_lost_hosts(30.0, now=140.0, session=session)] == ["gpu-a"]
    assert host.state == HostState.LOST.value
    assert mark_lost_hosts(30.0, now=150.0, session=session) == []
    assert heartbeat_host("gpu-a", session=session) == HostState.LOST, "a heartbeat is no proof that its launches are gone"
    assert host.state == HostState.LOST.value
    rejoin_host("gpu-a", session=session)
    assert host.state == HostState.ACTIVE.value
    assert [k for k, _ in _kinds(session)] == ["host_joined", "host_lost", "host_joined"]
    with pytest.raises(ValueError, match="host 'gpu-a' cannot rejoin: it is active, not lost"):
        rejoin_host("gpu-a", session=session)
    assert heartbeat_host("unknown-host", session=session) is None


def test_a_cancelled_launch_never_starts(session):
    job = _job(session, "launched_job", JobState.RUNNING)
    record_launch("first", job_id=job.id, host="gpu-a", session=session)
    record_launch("second", job_id=job.id, host="gpu-b", session=session)
    cancel_launches(["first"], session=session)
    assert not start_launch("first", worker_pid=10, session=session), "a late redelivery must not run"
    assert start_launch("second", worker_pid=11, session=session)
    assert not start_launch("second", worker_pid=12, session=session), "started once only"
    end_launch("second", rc=0, session=session)
    states = {h: (l.state, l.rc) for h, l in launches(["first", "second"], session=session).items()}
    assert states == {"first": (LaunchState.CANCELLED.value, None), "second": (LaunchState.ENDED.value, 0)}


def test_a_launch_whose_pool_process_died_is_ended_by_its_host(session):
    job = _job(session, "orphaned_launch", JobState.RUNNING)
    for handle, host, pid in (("dead", "gpu-a", 101), ("alive", "gpu-a", 102), ("elsewhere", "gpu-b", 101)):
        record_launch(handle, job_id=job.id, host=host, session=session)
        assert start_launch(handle, worker_pid=pid, session=session)
    assert end_dead_launches("gpu-a", lambda pid, job_id: pid != 101, session=session) == ["dead"]
    session.expire_all()
    states = {h: (l.state, l.rc) for h, l in launches(["dead", "alive", "elsewhere"], session=session).items()}
    assert states == {
        "dead": (LaunchState.ENDED.value, None),
        "alive": (LaunchState.STARTED.value, None),
        "elsewhere": (LaunchState.STARTED.value, None),  # another host's pids are not this host's
    }


def test_every_way_out_of_the_executors_hands_says_what_to_report(session):
    """The scheduler that queued the task reports it, whichever scheduler settled the job."""
    finished = _job(session, "finished", JobState.RUNNING)
    killed = _job(session, "killed", JobState.RUNNING)
    dropped, rejected = _job(session, "dropped"), _job(session, "rejected")
    transitions.finish(finished, "exit code 0", now=1.0, session=session)
    transitions.finish(killed, "process killed", killed=True, now=1.0, session=session)
    transitions.drop(dropped, "cleared", now=1.0, session=session)
    transitions.reject(rejected, "too big", now=1.0, session=session)
    assert [j.report for j in (finished, killed, dropped, rejected)] == ["success", "failed", "released", "released"]
    waiting = _job(session, "preempted_not_yet_queued", JobState.STOPPING)
    requeued = _job(session, "preempted_and_queued_again", JobState.STOPPING)
    transitions.settle_stopped(waiting, requeued=False, session=session)
    transitions.settle_stopped(requeued, requeued=True, session=session)
    assert (waiting.report, requeued.report) == ("released", None), "queued again: still held"
