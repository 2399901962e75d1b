"""Gangs (jobs on several hosts) through the executor's parts, cycle by cycle, over a real database
and a real Celery app on an in-memory broker (as tests/executors/test_parts.py): admitted on all
their hosts at once, node 0 launched as the task, the members once node 0 published its command,
stopped together, ended as one when a node is lost or does not start. Remote-control commands
(notices, kills) are read off the broker's pidbox exchange, as a host's worker would get them.
"""

from __future__ import annotations

import json
import time

import pytest
from celery import Celery
from kombu import Queue
from sqlalchemy import insert, select, update

from airflow.models.xcom import XComModel
from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.act import Actor
from airflow_quota_provider.executors.celery_launcher import CeleryLauncher
from airflow_quota_provider.executors.celery_worker import MEMBER_TASK_NAME, TASK_NAME, host_queue
from airflow_quota_provider.executors.gangs import Gangs
from airflow_quota_provider.executors.schedule import Scheduler
from airflow_quota_provider.models import transitions
from airflow_quota_provider.models.gang import GangState
from airflow_quota_provider.models.host import QuotaHost, QuotaLaunch, end_launch, start_launch
from airflow_quota_provider.models.job import JobState, QuotaDeviceAllocation, QuotaEvent, QuotaJob, Report, preemption_count
from airflow_quota_provider.protocol import GANG_NODE_FAILED, GANG_XCOM_KEY, GangCommand, GangEnvironment
from tests.executors.test_parts import CHECKPOINTS, LOG, NOW, Parts, _airflow_queues, _reconciler, _ti_state, clock  # noqa: F401  (a fixture)

QUOTAS = """
queues:
  - name: q
    capacity: 6
    quotas:
      - {name: team-a, capacity: 4, grace_period_s: 30}
      - {name: team-b, capacity: 2, grace_period_s: 30}
"""
HOSTS = {"gpu-a": "10.0.0.1", "gpu-b": "10.0.0.2", "gpu-c": "10.0.0.3"}
COMMAND = GangCommand(argv=["torchrun", "train.py"], env={"QUOTA_CHECKPOINT_DIR": "/ckpt/run", "LR": "0.1"}, cwd="/work")


@pytest.fixture
def config(tmp_path):
    from airflow_quota_provider.executors.config import QuotaConfig

    (tmp_path / "quotas.yaml").write_text(QUOTAS)
    return QuotaConfig(str(tmp_path / "quotas.yaml"), None, pools=dict)


@pytest.fixture
def parts(db, config, clock) -> Parts:
    """Three GPU hosts of two GPUs each for job queue ``q``."""
    launcher = CeleryLauncher(Celery("gangs", broker="memory://"))
    for name, address in HOSTS.items():
        db.add(QuotaHost(name=name, queues="q", devices="0,1", celery_name=f"celery@{name}", address=address,
                         registered_at=NOW, heartbeat_at=NOW))
    db.flush()
    parts = Parts(
        db, config, _reconciler(launcher, config), Scheduler(launcher, CHECKPOINTS),
        Actor(launcher, Gangs(launcher), config, LOG, token=lambda ti_id: f"token-{ti_id}"),
    )
    for host in HOSTS:  # the in-memory broker is one per process: what other tests sent is still there
        _sent(parts, host)
    return parts


@pytest.fixture
def pidbox(parts):
    """The remote-control commands the executor broadcasts to hosts (notices, kills), as sent."""
    app = parts.actor.launcher.app
    with app.connection_for_read() as conn:
        queue = conn.SimpleQueue(Queue("probe", exchange=app.control.mailbox(conn).exchange, routing_key=""))

        def sent() -> list[tuple[str, str, dict]]:
            out = []
            while True:
                try:
                    message = queue.get(timeout=0.05)
                except queue.Empty:
                    return out
                out.append((message.payload["destination"][0], message.payload["method"], message.payload["arguments"]))
                message.ack()

        yield sent


def _gang(db, task_id: str = "pretrain", *, nodes: int = 2, gpus: int = 2, quota: str = "team-a", priority: int = 1) -> QuotaJob:
    workload = _airflow_queues(db, task_id, quota=quota, priority=priority, pool_slots=gpus * nodes)
    job = QuotaJob(dag_id="d", run_id="r", task_id=task_id, map_index=-1, try_number=1)
    transitions.submit(
        job, workload=workload.model_dump_json(), ti_id=str(workload.ti.id), quota=quota, gpus=gpus * nodes, nodes=nodes,
        priority=priority, preemptible=True, max_preemptions=None, grace_period_s=None, expected_runtime_s=None,
        now=time.time(), session=db,
    )
    return job


def _sent(parts, host: str) -> list:
    """The launches published to ``host``'s queue: (task name, its arguments)."""
    out = []
    with parts.actor.launcher.app.connection_for_read() as broker, broker.SimpleQueue(host_queue(host)) as queue:
        while True:
            try:
                message = queue.get(timeout=0.05)
            except queue.Empty:
                return out
            out.append((message.headers["task"], json.loads(message.body)[0]))
            message.ack()


def _running(db, job: QuotaJob, port: int | None = 29511) -> None:
    """Node 0's host took its launch (choosing ``port``) and the task reported running."""
    assert start_launch(job.handle, worker_pid=100 + job.id, port=port, session=db)
    db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.RUNNING))


def _publish(db, job: QuotaJob, command: GangCommand = COMMAND) -> None:
    """Node 0 pushed its command (the XCom row its task's push writes; foreign keys not enforced)."""
    db.execute(insert(XComModel.__table__).values(
        dag_run_id=1, task_id=job.task_id, map_index=-1, key=GANG_XCOM_KEY, dag_id=job.dag_id, run_id=job.run_id,
        value=command.to_dict(),
    ))


def _members_started(parts, job: QuotaJob) -> list[str]:
    parts.reconciler.watch_gangs(parts.cycle())
    handles = list(GangState.of(job).member_handles().values())
    for handle in handles:
        assert start_launch(handle, worker_pid=200, session=parts.session)
    return handles


def test_a_gang_is_admitted_on_as_many_hosts_at_once_and_node_0_starts_as_the_task(db, parts):
    job = _gang(db)
    parts.decide_and_act()
    gang = GangState.of(job)
    assert job.state == JobState.RUNNING.value and len(set(gang.hosts)) == 2 and job.host == gang.hosts[0]
    held = db.execute(select(QuotaDeviceAllocation.host, QuotaDeviceAllocation.device).where(QuotaDeviceAllocation.job_id == job.id))
    assert sorted(held) == sorted((h, d) for h in gang.hosts for d in ("0", "1"))
    admitted = db.scalars(select(QuotaEvent).where(QuotaEvent.job_id == job.id, QuotaEvent.kind == "admitted")).all()
    assert [(e.host, e.devices, e.message) for e in admitted] == [
        (gang.hosts[0], "0,1", "by scheduler job 7; node 0 of 2"), (gang.hosts[1], "0,1", "by scheduler job 7; node 1 of 2")
    ]
    ((task, (_, job_id, env)),) = _sent(parts, job.host)
    assert (task, job_id, env["CUDA_VISIBLE_DEVICES"]) == (TASK_NAME, job.id, "0,1")
    # Everything of the gang but the port, which node 0's host chooses where it starts.
    assert (env["QUOTA_NNODES"], env["QUOTA_NODE_RANK"], env["QUOTA_NPROC_PER_NODE"], env["WORLD_SIZE"]) == ("2", "0", "2", "4")
    assert (env["MASTER_ADDR"], env["QUOTA_RDZV_ID"], "MASTER_PORT" in env) == (HOSTS[job.host], job.job_id, False)
    assert _sent(parts, gang.hosts[1]) == [], "no member before node 0 published its command"


def test_the_members_start_once_node_0_published_its_command_and_its_host_its_port(db, parts):
    job = _gang(db)
    parts.decide_and_act()
    _running(db, job, port=None)
    _publish(db, job)
    assert not parts.reconciler.watch_gangs(parts.cycle()), "node 0's host has not said its port yet"
    db.execute(update(QuotaLaunch).where(QuotaLaunch.handle == job.handle).values(port=29511))
    assert parts.reconciler.watch_gangs(parts.cycle())

    member_host = GangState.of(job).hosts[1]
    ((task, (job_id, rank, argv, cwd, env)),) = _sent(parts, member_host)
    assert (task, job_id, rank, argv, cwd) == (MEMBER_TASK_NAME, job.id, 1, COMMAND.argv, COMMAND.cwd)
    assert GangEnvironment.read(env) == GangEnvironment(
        nnodes=2, node_rank=1, nproc_per_node=2, master_addr=HOSTS[job.host], master_port=29511, rdzv_id=job.job_id
    )
    assert (env["CUDA_VISIBLE_DEVICES"], env["QUOTA_HOST"], env["QUOTA_CHECKPOINT_DIR"], env["LR"]) == (
        "0,1", member_host, "/ckpt/run", "0.1"
    )
    launch = db.get(QuotaLaunch, GangState.of(job).nodes[1].handle)
    assert (launch.node_rank, launch.host, launch.state) == (1, member_host, "sent")
    assert not parts.reconciler.watch_gangs(parts.cycle()), "started once"


def test_a_command_published_by_an_earlier_run_is_dropped_at_the_admission(db, parts):
    job = _gang(db)
    _publish(db, job, GangCommand(argv=["old"], env={"QUOTA_RESUME_FROM": "/ckpt/step-1"}, cwd=None))
    parts.decide_and_act()
    _running(db, job)
    assert not parts.reconciler.watch_gangs(parts.cycle()), "the members wait for this run's command"


def test_a_member_that_fails_has_node_0_told_and_the_other_members_killed(db, parts, pidbox):
    job = _gang(db, nodes=3, gpus=2, quota="team-a")  # 6 GPUs: borrows 2 of team-b's
    parts.decide_and_act()
    _running(db, job)
    _publish(db, job)
    first, second = _members_started(parts, job)
    pidbox()
    end_launch(first, rc=1, session=db)

    assert parts.reconciler.watch_gangs(parts.cycle())
    gang = GangState.of(job)
    sent = pidbox()
    (notice,) = [args["notice"] for host, method, args in sent if method == "quota_notify"]
    assert ([h for h, method, _ in sent if method == "quota_notify"], notice["reason"]) == (
        [f"celery@{job.host}"], GANG_NODE_FAILED
    )
    assert notice["message"] == f"gang stopped: node 1 of 3 on host {gang.hosts[1]} exited with code 1"
    assert [h for h, method, _ in sent if method == "quota_kill"] == [f"celery@{gang.hosts[2]}"]
    assert job.state == JobState.RUNNING.value, "node 0's task fails by itself, saying why"
    assert not parts.reconciler.watch_gangs(parts.cycle()), "told once"


def test_node_0_ending_ends_the_members_and_frees_the_devices_only_once_none_runs(db, parts, pidbox):
    job = _gang(db)
    parts.decide_and_act()
    _running(db, job)
    _publish(db, job)
    (member,) = _members_started(parts, job)
    pidbox()
    end_launch(job.handle, rc=0, session=db)
    db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.SUCCESS))

    hosts = GangState.of(job).hosts
    parts.reconciler.watch_launches(parts.cycle())
    assert job.state == JobState.RUNNING.value, "its member still runs on its GPUs"
    assert {(h, m) for h, m, _ in pidbox()} == {(f"celery@{hosts[1]}", "quota_kill"), (f"celery@{hosts[1]}", "revoke")}
    end_launch(member, rc=None, session=db)
    assert parts.reconciler.watch_launches(parts.cycle())
    assert job.state == JobState.FINISHED.value
    assert db.scalars(select(QuotaDeviceAllocation).where(QuotaDeviceAllocation.job_id == job.id)).all() == []
    released = db.execute(select(QuotaEvent.host, QuotaEvent.devices).where(
        QuotaEvent.job_id == job.id, QuotaEvent.kind == "released")).all()
    assert released == [(hosts[0], "0,1"), (hosts[1], "0,1")], "one event per host, node 0's first"
    assert GangState.of(job).nodes == []


def test_a_lost_member_host_ends_the_gang_which_waits_at_its_place_without_a_retry_or_preemption(db, parts, clock):
    job = _gang(db)
    parts.decide_and_act()
    _running(db, job)
    _publish(db, job)
    (member,) = _members_started(parts, job)
    member_host = GangState.of(job).hosts[1]
    db.execute(update(QuotaHost).where(QuotaHost.name == member_host).values(state="lost"))

    assert parts.reconciler.watch_gangs(parts.cycle())
    assert _ti_state(db, job) == TaskInstanceState.UP_FOR_RESCHEDULE, "node 0's supervisor ends its task"
    assert job.state == JobState.STOPPING.value, "node 0 still runs"
    # Airflow queues the task again before node 0 is gone: the job takes it, stopping (it crashed the
    # scheduler while the job said running).
    db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.QUEUED))
    transitions.submit(
        job, workload=job.workload, ti_id=job.ti_id, quota="team-a", gpus=4, nodes=2, priority=1, preemptible=True,
        max_preemptions=None, grace_period_s=None, expected_runtime_s=None, now=time.time(), session=db,
    )
    assert job.state == JobState.STOPPING.value
    end_launch(job.handle, rc=0, session=db)
    assert parts.reconciler.watch_launches(parts.cycle())
    assert (job.state, job.pending_reason) == (
        JobState.PENDING.value,
        f"evicted (gang ended: node 1 of 2 on host {member_host} lost); waiting to be queued again",
    ), "queued again already: it waits at its place"
    assert preemption_count("d", "r", "pretrain", -1, session=db) == 0
    assert GangState.of(job).not_before is None, "a lost host is no failed start: no backoff"


def test_a_gang_whose_members_do_not_start_in_time_backs_off_doubling_then_fails(db, parts, clock, monkeypatch):
    monkeypatch.setenv("AIRFLOW__QUOTA__GANG_START_TIMEOUT_S", "120")
    monkeypatch.setenv("AIRFLOW__QUOTA__GANG_BACKOFF_S", "10")
    monkeypatch.setenv("AIRFLOW__QUOTA__GANG_START_LIMIT", "1")
    job = _gang(db)
    backoffs = []
    for attempt in range(2):
        parts.decide_and_act()
        assert job.state == JobState.RUNNING.value, f"admitted, attempt {attempt}"
        _running(db, job)  # node 0 runs, and never publishes its command
        clock.shift(120)
        assert not parts.reconciler.watch_gangs(parts.cycle())
        clock.shift(1)
        assert parts.reconciler.watch_gangs(parts.cycle())
        end_launch(job.handle, rc=0, session=db)
        assert parts.reconciler.watch_launches(parts.cycle())
        if attempt == 1:
            break
        backoffs.append(GangState.of(job).not_before - time.time())
        assert job.state == JobState.PREEMPTED.value and "admitted again after 10 s (start 1 of 2)" in job.pending_reason
        # Airflow queues it again; it stays unseen by the policy until its backoff is over.
        db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.QUEUED))
        transitions.submit(
            job, workload=job.workload or _airflow_workload(db, job), ti_id=job.ti_id, quota="team-a", gpus=4, nodes=2,
            priority=1, preemptible=True, max_preemptions=None, grace_period_s=None, expected_runtime_s=None,
            now=time.time(), session=db,
        )
        parts.decide_and_act()
        assert job.state == JobState.PENDING.value, "backing off"
        clock.shift(10)
    assert backoffs == [pytest.approx(10)]
    assert job.state == JobState.FAILED.value and _ti_state(db, job) == TaskInstanceState.FAILED
    assert job.report == Report.RELEASED.value, "its task instance is failed already: no success reported to Airflow"
    assert job.message.startswith("the gang did not start 2 times ([quota] gang_start_limit 1); last: nodes 1 not started 120 s")


def test_a_member_its_host_has_not_taken_by_the_gang_start_timeout_ends_the_gang(db, parts, clock, monkeypatch):
    """The start timeout bounds a member sent to a host that does not take it, not only one whose
    command node 0 has not published: here the gang's 120 s, not a launch's 600 s."""
    monkeypatch.setenv("AIRFLOW__QUOTA__GANG_START_TIMEOUT_S", "120")
    monkeypatch.setenv("AIRFLOW__QUOTA__LAUNCH_START_TIMEOUT_S", "600")
    job = _gang(db)
    parts.decide_and_act()
    _running(db, job)
    _publish(db, job)
    assert parts.reconciler.watch_gangs(parts.cycle())  # the member is sent to its host
    assert [task for task, _ in _sent(parts, GangState.of(job).nodes[1].host)] == [MEMBER_TASK_NAME]
    clock.shift(120)
    assert not parts.reconciler.watch_gangs(parts.cycle())
    clock.shift(1)
    assert parts.reconciler.watch_gangs(parts.cycle())
    assert GangState.of(job).ending == (
        "nodes 1 not started 120 s after the admission (the hosts of node 1 have not taken their launch)")


def _airflow_workload(db, job: QuotaJob) -> str:
    from tests.executors.test_parts import _airflow_queues as queues

    db.execute(TaskInstance.__table__.delete().where(TaskInstance.task_id == job.task_id))
    workload = queues(db, job.task_id, quota=job.quota, priority=job.priority, pool_slots=job.gpus)
    job.ti_id = str(workload.ti.id)
    return workload.model_dump_json()


def test_a_preempted_gang_tells_every_node_and_counts_one_preemption(db, parts, clock, pidbox):
    borrower = _gang(db, "borrower", nodes=2, gpus=2, quota="team-b")  # 4 of team-b's 2: borrows 2
    parts.decide_and_act()
    _running(db, borrower)
    _publish(db, borrower)
    (member,) = _members_started(parts, borrower)
    pidbox()
    owner = _gang(db, "owner", nodes=2, gpus=2, quota="team-a", priority=5)  # team-a's own 4
    parts.decide_and_act()
    assert borrower.state == JobState.STOPPING.value and owner.state == JobState.PENDING.value
    notices = [(h, args["notice"]["reason"]) for h, method, args in pidbox() if method == "quota_notify"]
    assert sorted(notices) == sorted((f"celery@{h}", "reclaim") for h in GangState.of(borrower).hosts)

    end_launch(member, rc=0, session=db)  # checkpointed and exited on its notice
    db.execute(update(TaskInstance).where(TaskInstance.task_id == "borrower").values(state=TaskInstanceState.UP_FOR_RESCHEDULE))
    end_launch(borrower.handle, rc=0, session=db)
    assert parts.reconciler.watch_launches(parts.cycle())
    assert borrower.state == JobState.PREEMPTED.value
    assert preemption_count("d", "r", "borrower", -1, session=db) == 1
    parts.decide_and_act()
    assert owner.state == JobState.RUNNING.value and len(set(GangState.of(owner).hosts)) == 2
