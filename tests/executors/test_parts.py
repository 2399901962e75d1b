"""The executor's parts, cycle by cycle, over a real database: the scheduler decides, the actor
launches on a GPU host and tells victims to stop, the reconciler settles what hosts and processes did.

Rows are seeded in SQLite (Airflow's ``task_instance`` beside the provider's tables), the host side
is the Celery launcher's tables written by the functions a GPU host's worker calls, tasks go out
through a real Celery app on an in-memory broker, and time moves with ``time_machine`` (the cycle's
clock on SQLite is the machine's). Each test runs in well under a second.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

import pytest
from celery import Celery
from sqlalchemy import insert, select, update
from sqlalchemy.orm import Session

from airflow.executors import workloads
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.act import Actor
from airflow_quota_provider.executors.celery_launcher import CeleryLauncher
from airflow_quota_provider.executors.celery_worker import host_queue
from airflow_quota_provider.executors.gangs import Gangs
from airflow_quota_provider.executors.config import QuotaConfig
from airflow_quota_provider.executors.cycle import Cycle
from airflow_quota_provider.executors.launcher import Launcher, Liveness
from airflow_quota_provider.executors.local_launcher import LocalLauncher
from airflow_quota_provider.executors.reconcile import FORCE_KILL_AFTER_S, Reconciler
from airflow_quota_provider.executors.runtimes import CheckpointTimes, local_checkpoint_dir
from airflow_quota_provider.executors.schedule import Scheduler
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.host import QuotaHost, QuotaLaunch, end_launch, start_launch
from airflow_quota_provider.models.job import JobState, QuotaEvent, QuotaJob, Report, devices_of, preemption_count
from airflow_quota_provider.policy import PreemptionReason
from airflow_quota_provider.protocol import TaskEnvironment

NOW = 1_800_000_000.0
LOG = logging.getLogger(__name__)
CHECKPOINTS = CheckpointTimes(local_checkpoint_dir)  # no checkpoint directories here: always none
SCHEDULER_JOB = 7
GRACE_S = 30
QUOTAS = f"""
queues:
  - name: q
    capacity: 2
    quotas:
      - {{name: team-a, capacity: 1, grace_period_s: {GRACE_S}}}
      - {{name: team-b, capacity: 1, grace_period_s: {GRACE_S}}}
"""


@dataclass
class Parts:
    """The three parts of one executor, as ``QuotaExecutor.start`` makes them, and its session."""

    session: Session
    config: QuotaConfig
    reconciler: Reconciler
    scheduler: Scheduler
    actor: Actor

    def cycle(self) -> Cycle:
        return Cycle.begin(self.session, self.config.quota_file, SCHEDULER_JOB)

    def decide_and_act(self) -> None:
        cycle = self.cycle()
        self.actor.act(cycle, self.scheduler.plan(cycle))
        self.session.flush()


@pytest.fixture
def clock(time_machine):
    time_machine.move_to(NOW, tick=False)
    return time_machine


@pytest.fixture
def config(tmp_path) -> QuotaConfig:
    (tmp_path / "quotas.yaml").write_text(QUOTAS)
    return QuotaConfig(str(tmp_path / "quotas.yaml"), None, pools=dict)


def _reconciler(launcher: Launcher, config: QuotaConfig) -> Reconciler:
    return Reconciler(launcher, Gangs(launcher), config, CHECKPOINTS, LOG, executor_names={"QuotaExecutor"}, default_executor=False)


@pytest.fixture
def parts(db, config, clock) -> Parts:
    """One GPU host, ``gpu-a``, with two GPUs for job queue ``q``."""
    launcher = CeleryLauncher(Celery("parts", broker="memory://"))
    db.add(QuotaHost(name="gpu-a", queues="q", devices="0,1", celery_name="celery@gpu-a", registered_at=NOW, heartbeat_at=NOW))
    db.flush()
    # The in-memory broker is one per process: what other tests sent to gpu-a is still queued there.
    with launcher.app.connection_for_read() as broker, broker.SimpleQueue(host_queue("gpu-a")) as queue:
        queue.clear()
    return Parts(
        db,
        config,
        _reconciler(launcher, config),
        Scheduler(launcher, CHECKPOINTS),
        Actor(launcher, Gangs(launcher), config, LOG, token=lambda ti_id: f"token-{ti_id}"),
    )


def _airflow_queues(
    db: Session, task_id: str, *, quota: str, priority: int, pool_slots: int = 1, executor_config: dict | None = None
) -> workloads.ExecuteTask:
    """A task Airflow has just queued (its task instance row) and the workload it hands the executor."""
    ti_id = uuid.uuid4()
    db.execute(insert(TaskInstance.__table__).values(
        id=ti_id, dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1, state=TaskInstanceState.QUEUED,
        pool=quota, pool_slots=pool_slots, queued_by_job_id=SCHEDULER_JOB,
    ))
    return workloads.ExecuteTask(
        token="", dag_rel_path="d.py", bundle_info={"name": "dags"}, log_path=f"{task_id}.log",
        ti={"id": ti_id, "task_id": task_id, "dag_id": "d", "run_id": "r", "try_number": 1,
            "dag_version_id": uuid.uuid4(), "pool_slots": pool_slots, "priority_weight": priority,
            "executor_config": executor_config},
    )


def _queued(db: Session, task_id: str, *, quota: str = "team-a", priority: int = 1) -> QuotaJob:
    """A task Airflow has just queued, and its job as the executor records it."""
    workload = _airflow_queues(db, task_id, quota=quota, priority=priority)
    job = QuotaJob(dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1)
    transitions.submit(
        job, workload=workload.model_dump_json(), ti_id=str(workload.ti.id), quota=quota, gpus=1, priority=priority,
        preemptible=True, max_preemptions=None, grace_period_s=None, expected_runtime_s=None, now=time.time(), session=db,
    )
    return job


def _ti_state(db: Session, job: QuotaJob) -> str:
    return db.scalar(select(TaskInstance.state).where(TaskInstance.task_id == job.task_id))


def _started(db: Session, *jobs: QuotaJob) -> None:
    """The host's worker took each launch and the task reported running."""
    for job in jobs:
        assert start_launch(job.handle, worker_pid=100 + job.id, session=db)
        db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.RUNNING))


def _events(db: Session, job: QuotaJob) -> list[str]:
    return list(db.scalars(select(QuotaEvent.kind).where(QuotaEvent.job_id == job.id).order_by(QuotaEvent.id)))


def test_a_waiting_job_within_its_quota_gets_free_devices_on_a_host_and_is_launched(db, parts):
    job = _queued(db, "within_quota")
    parts.decide_and_act()
    assert (job.state, job.host, devices_of(job.id, session=db)) == (JobState.RUNNING.value, "gpu-a", ["0"])
    launch = db.get(QuotaLaunch, job.handle)
    assert (launch.job_id, launch.host, launch.state, launch.sent_at) == (job.id, "gpu-a", "sent", NOW)
    assert _events(db, job) == ["submitted", "admitted"]

    with parts.actor.launcher.app.connection_for_read() as broker, broker.SimpleQueue(host_queue("gpu-a")) as queue:
        workload, job_id, env = json.loads(queue.get(timeout=1).body)[0]  # what the host's worker gets
    assert job_id == job.id and json.loads(workload)["token"].startswith("token-")
    assert TaskEnvironment.read(env) == TaskEnvironment(
        cuda_visible_devices="0", job_id=job.job_id, host="gpu-a", quota="team-a", preemption_count=0,
        grace_period_s=GRACE_S,
    )


def test_a_reclaim_stops_the_borrower_at_its_deadline_and_hands_its_gpu_to_the_lender(db, parts, clock):
    own, borrower = _queued(db, "own", priority=5), _queued(db, "borrower")
    parts.decide_and_act()
    _started(db, own, borrower)
    assert (own.state, borrower.state) == (JobState.RUNNING.value, JobState.RUNNING.value)

    clock.shift(60)
    lender = _queued(db, "lender", quota="team-b")
    parts.decide_and_act()
    assert (borrower.state, borrower.preempt_reason, borrower.preempt_deadline) == ("stopping", "reclaim", NOW + 60 + GRACE_S)
    assert (own.state, lender.state) == (JobState.RUNNING.value, JobState.PENDING.value)

    clock.shift(GRACE_S - 1)
    assert not parts.reconciler.enforce_deadlines(parts.cycle())
    assert _ti_state(db, borrower) == TaskInstanceState.RUNNING

    clock.shift(1)
    assert parts.reconciler.enforce_deadlines(parts.cycle())
    assert (_ti_state(db, borrower), borrower.forced_at) == (TaskInstanceState.UP_FOR_RESCHEDULE, NOW + 60 + GRACE_S)

    end_launch(borrower.handle, rc=0, session=db)  # its supervisor saw the new state and ended it
    assert parts.reconciler.watch_launches(parts.cycle())
    assert (borrower.state, devices_of(borrower.id, session=db)) == (JobState.PREEMPTED.value, [])
    assert preemption_count("d", "r", "borrower", -1, session=db) == 1
    parts.decide_and_act()
    assert (lender.state, devices_of(lender.id, session=db)) == (JobState.RUNNING.value, ["1"])


def _queued_again(db: Session, job: QuotaJob) -> str:
    """Airflow queues the job's task again on the same try, with a new workload, as the executor's
    ``queue_workload`` records it."""
    db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.QUEUED))
    workload = json.dumps({**json.loads(job.workload), "token": "again"})
    transitions.submit(
        job, workload=workload, ti_id=job.ti_id, quota=job.quota, gpus=job.gpus, priority=job.priority, preemptible=True,
        max_preemptions=None, grace_period_s=None, expected_runtime_s=None, now=time.time(), session=db,
    )
    return workload


def test_a_task_queued_again_on_its_try_before_its_run_ended_waits_for_its_process_then_runs_again(db, parts, clock):
    job = _queued(db, "deferring")
    parts.decide_and_act()
    _started(db, job)
    clock.shift(5)  # it deferred, its trigger fired and Airflow queued it again before the host said its run ended
    workload = _queued_again(db, job)
    assert (job.state, devices_of(job.id, session=db)) == (JobState.RUNNING.value, ["0"]), "held until its process is gone"
    parts.decide_and_act()
    assert job.state == JobState.RUNNING.value and db.get(QuotaLaunch, job.handle) is not None, "not launched twice"

    end_launch(job.handle, rc=0, session=db)
    assert parts.reconciler.watch_launches(parts.cycle())
    assert (job.state, job.report, job.submitted_at, job.workload) == (JobState.PENDING.value, None, NOW + 5, workload)
    assert devices_of(job.id, session=db) == []
    assert _events(db, job) == ["submitted", "admitted", "submitted", "released", "finished"]
    parts.decide_and_act()
    assert job.state == JobState.RUNNING.value and _events(db, job)[-1] == "admitted", "launched with the new workload"


def test_a_task_whose_process_ended_while_it_was_still_queued_is_finished_and_reported(db, parts):
    """Not queued again since its admission: its process ended before its task ran (the task instance
    still queued from the admission), which Airflow hears of."""
    job = _queued(db, "never_ran")
    parts.decide_and_act()
    assert start_launch(job.handle, worker_pid=100 + job.id, session=db)
    end_launch(job.handle, rc=None, session=db)
    assert parts.reconciler.watch_launches(parts.cycle())
    assert (job.state, job.report) == (JobState.FINISHED.value, Report.FAILED.value)


def test_a_stopping_job_still_running_a_minute_after_its_task_was_stopped_is_killed(db, config, tmp_path, clock):
    """Its supervisor should have ended it on the new state; a real process that outlives that is killed."""
    launcher = LocalLauncher(tmp_path / "state", ["0"], cgroups=False)
    reconciler = _reconciler(launcher, config)
    job = _queued(db, "outlives_its_stop")
    job.queue_name = "q"
    transitions.admit(job, host=launcher.HOST, devices=["0"], now=NOW, session=db)
    transitions.launched(job, f"{job.id}:{launcher.start(job.id, lambda: time.sleep(120) or 0, {})}")
    transitions.begin_stop(job, preemptor="urgent", reason=PreemptionReason.RECLAIM, deadline=NOW, fail_message=None, session=db)
    assert reconciler.enforce_deadlines(Cycle.begin(db, config.quota_file))
    assert _ti_state(db, job) == TaskInstanceState.UP_FOR_RESCHEDULE, "a task still starting is stopped too"

    clock.shift(FORCE_KILL_AFTER_S)
    reconciler.enforce_deadlines(Cycle.begin(db, config.quota_file))
    assert launcher.status({job.handle: job.id}, session=db)[job.handle].liveness == Liveness.RUNNING
    clock.shift(1)
    reconciler.enforce_deadlines(Cycle.begin(db, config.quota_file))
    deadline = time.monotonic() + 10
    while launcher.status({job.handle: job.id}, session=db)[job.handle].liveness != Liveness.ENDED:
        assert time.monotonic() < deadline, "the process was not killed"
        time.sleep(0.05)


def test_a_lost_hosts_jobs_go_back_to_their_place_without_a_preemption(db, parts, clock):
    job = _queued(db, "on_lost_host")
    parts.decide_and_act()
    _started(db, job)

    clock.shift(29)  # [quota] host_lost_after_s is 30 s
    assert not parts.reconciler.check_hosts(parts.cycle())
    clock.shift(2)
    cycle = parts.cycle()
    assert parts.reconciler.check_hosts(cycle)
    assert parts.reconciler.watch_launches(cycle)
    assert (_ti_state(db, job), job.state, devices_of(job.id, session=db)) == (
        TaskInstanceState.UP_FOR_RESCHEDULE, JobState.PREEMPTED.value, []
    )
    assert job.submitted_at == NOW and job.pending_reason == "evicted (host gpu-a lost); waiting to be queued again"
    assert preemption_count("d", "r", "on_lost_host", -1, session=db) == 0
    assert _events(db, job)[-1] == "evicted"


def test_a_launch_its_host_never_took_is_undone_and_the_job_waits_again(db, parts, clock):
    job = _queued(db, "never_taken")
    parts.decide_and_act()
    handle = job.handle

    clock.shift(60)  # [quota] launch_start_timeout_s is 60 s
    assert not parts.reconciler.watch_launches(parts.cycle())
    clock.shift(1)
    assert parts.reconciler.watch_launches(parts.cycle())
    assert (job.state, job.handle, devices_of(job.id, session=db)) == (JobState.PENDING.value, None, [])
    assert job.pending_reason == "launch failed: not started by host gpu-a in time; launched again"
    assert db.get(QuotaLaunch, handle).state == "cancelled", "a late start on the host is refused"


def test_a_waiting_task_is_kept_from_airflows_queued_timeout(db, parts, clock):
    """``task_queued_timeout`` (600 s) revokes a task queued that long: a waiting one's queued time is
    refreshed once a quarter of it has passed."""
    _queued(db, "kept_waiting")
    db.execute(update(TaskInstance).values(queued_dttm=datetime.fromtimestamp(NOW, timezone.utc)))
    assert not parts.reconciler.keep_queued_alive(parts.cycle())
    clock.shift(151)
    assert parts.reconciler.keep_queued_alive(parts.cycle())
    refreshed = db.scalar(select(TaskInstance.queued_dttm))
    assert refreshed.replace(tzinfo=timezone.utc).timestamp() == NOW + 151


def test_a_job_of_a_quota_no_job_queue_has_fails_its_task_naming_the_quotas(db, parts):
    job = _queued(db, "unknown_quota", quota="team-z")
    parts.decide_and_act()
    assert (job.state, _ti_state(db, job)) == (JobState.FAILED.value, TaskInstanceState.FAILED)
    assert job.message == f"quota: 'team-z' is not one of team-a, team-b (quota file {parts.config.path})"


def test_a_job_whose_task_was_cleared_while_it_waited_is_dropped_and_released(db, parts):
    job = _queued(db, "cleared_while_waiting")
    db.execute(update(TaskInstance).values(state=None))
    parts.decide_and_act()
    assert (job.state, devices_of(job.id, session=db)) == (JobState.FINISHED.value, [])
    assert [(key.task_id, report) for key, report in parts.reconciler.reports(parts.cycle())] == [
        ("cleared_while_waiting", Report.RELEASED)
    ]
    assert job.report is None, "released once"


def test_a_task_asking_for_several_hosts_is_a_gang_counting_every_nodes_gpus(db, parts, executor_for):
    """``nodes`` > 1 makes a gang (tests/executors/test_gangs.py): 8 GPUs on each of 4 hosts count 32."""
    executor = executor_for(QUOTAS)
    workload = _airflow_queues(
        db, "gang", quota="team-a", priority=60, pool_slots=32, executor_config={"quota": {"gpus": 8, "nodes": 4}}
    )
    executor.queue_workload(workload, db)
    job = db.scalar(select(QuotaJob).where(QuotaJob.task_id == "gang"))
    assert (job.state, job.gpus, job.nodes, _ti_state(db, job)) == (JobState.PENDING.value, 32, 4, TaskInstanceState.QUEUED)
    assert _events(db, job) == ["submitted"]


@pytest.mark.parametrize(
    ("asked", "reason"),
    [
        pytest.param(
            {"gpus": "four"}, """executor_config["quota"]["gpus"]: 'four' is not an integer from 1 to 2097151""",
            id="gpus in words",
        ),
        pytest.param(
            {"gpus": 8, "nodes": 0}, 'executor_config["quota"]["nodes"]: 0 is not an integer from 1 to 1024',
            id="nodes out of range",
        ),
        pytest.param(
            {"priority": "x"}, """executor_config["quota"]["priority"]: 'x' is not an integer from 0 to 2147483647""",
            id="priority in words",
        ),
        pytest.param(
            {"grace_period_s": "nan"},
            """executor_config["quota"]["grace_period_s"]: 'nan' is not a finite number of seconds > 0, at most 86400""",
            id="NaN grace period",
        ),
    ],
)
def test_a_task_with_junk_executor_config_fails_naming_the_field_and_the_executor_takes_the_next(
    db, parts, executor_for, asked, reason
):
    """A hand-written ``executor_config["quota"]`` the executor cannot use fails that task when it is
    queued, as an unknown quota does, not the scheduler: its job is recorded with its pool as quota,
    its pool slots as GPUs and its priority weight, and the next task is queued and runs."""
    executor = executor_for(QUOTAS)
    junk = _airflow_queues(db, "junk", quota="team-a", priority=60, pool_slots=2, executor_config={"quota": asked})
    executor.queue_workload(junk, db)
    job = db.scalar(select(QuotaJob).where(QuotaJob.task_id == "junk"))
    assert (job.state, job.quota, job.gpus, job.priority, job.message, _ti_state(db, job)) == (
        JobState.FAILED.value, "team-a", 2, 60, reason, TaskInstanceState.FAILED
    )
    assert _events(db, job) == ["submitted", "rejected"]
    assert [(key.task_id, report) for key, report in parts.reconciler.reports(parts.cycle())] == [("junk", Report.RELEASED)]

    executor.queue_workload(_airflow_queues(db, "next", quota="team-a", priority=1), db)
    parts.decide_and_act()
    after = db.scalar(select(QuotaJob).where(QuotaJob.task_id == "next"))
    assert (after.state, devices_of(after.id, session=db)) == (JobState.RUNNING.value, ["0"])


def test_jobs_admitted_in_one_cycle_are_each_recorded_and_sent_to_their_host(db, parts):
    first, second = _queued(db, "first", quota="team-a"), _queued(db, "second", quota="team-b")
    parts.decide_and_act()
    assert {job.state for job in (first, second)} == {JobState.RUNNING.value}
    assert {db.get(QuotaLaunch, job.handle).state for job in (first, second)} == {"sent"}
    with parts.actor.launcher.app.connection_for_read() as broker, broker.SimpleQueue(host_queue("gpu-a")) as queue:
        sent = sorted(json.loads(queue.get(timeout=1).body)[0][1] for _ in range(2))  # each message's job id
    assert sent == sorted([first.id, second.id])


def test_launches_the_broker_refuses_put_their_jobs_back_in_line_saying_why(db, parts):
    """A broker that cannot be reached fails each launch, not the cycle: the jobs wait again with
    their devices free, and their launch rows are cancelled so no worker would run them."""
    app = Celery("refusing", broker="redis://127.0.0.1:1/0")
    app.conf.task_publish_retry = False
    app.conf.broker_transport_options = {"max_retries": 1, "interval_start": 0, "interval_step": 0.1, "interval_max": 0.1}
    parts.actor.launcher = CeleryLauncher(app)
    first, second = _queued(db, "first", quota="team-a"), _queued(db, "second", quota="team-b")
    parts.decide_and_act()
    for job in (first, second):
        assert (job.state, job.handle, devices_of(job.id, session=db)) == (JobState.PENDING.value, None, [])
        assert job.pending_reason.startswith("launch failed: "), job.pending_reason
    assert set(db.scalars(select(QuotaLaunch.state).where(QuotaLaunch.job_id.in_([first.id, second.id])))) == {"cancelled"}
