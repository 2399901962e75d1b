"""GPU types (issue 33) through the executor's parts, cycle by cycle, over a real database and a real
Celery app on an in-memory broker (as tests/executors/test_parts.py): two GPU hosts of different
types serve one typed job queue; a job asking for a type lands on a host of that type with the type
recorded and in its environment, an untyped one takes the first type with room, and a job holding a
type counts on it until its devices are freed. Also the local launcher's one machine of one type.
"""

from __future__ import annotations

import json
import re

import pytest
from celery import Celery
from sqlalchemy import select, update

from airflow.models.taskinstance import TaskInstance
from airflow.utils.state import TaskInstanceState
from airflow_quota_provider.executors.act import Actor
from airflow_quota_provider.executors.celery_launcher import CeleryLauncher
from airflow_quota_provider.executors.celery_worker import host_queue
from airflow_quota_provider.executors.config import QuotaConfig
from airflow_quota_provider.executors.gangs import Gangs
from airflow_quota_provider.executors.schedule import Scheduler
from airflow_quota_provider.models.host import QuotaHost, end_launch, register_host
from airflow_quota_provider.models.job import JobState, QuotaEvent, QuotaJob, devices_of
from airflow_quota_provider.protocol import TaskEnvironment
from airflow_quota_provider.quota_file import QuotaConfigError
from tests.executors.test_parts import CHECKPOINTS, LOG, Parts, _airflow_queues, _reconciler, _started, _ti_state, clock  # noqa: F401  (a fixture)

QUOTAS = """
queues:
  - name: typed
    capacity: {h100: 2, a100: 2}
    quotas:
      - {name: team-a, capacity: {h100: 1, a100: 1}, grace_period_s: 30}
      - {name: team-b, capacity: {h100: 1, a100: 1}, grace_period_s: 30}
"""
HOSTS = {"types-h100": "h100", "types-a100": "a100"}


@pytest.fixture
def config(tmp_path) -> QuotaConfig:
    (tmp_path / "quotas.yaml").write_text(QUOTAS)
    return QuotaConfig(str(tmp_path / "quotas.yaml"), None, pools=dict)


@pytest.fixture
def parts(db, config, clock) -> Parts:
    """Two GPU hosts of two GPUs each for job queue ``typed``, registered as their workers do."""
    launcher = CeleryLauncher(Celery("types", broker="memory://"))
    for name, gpu_type in HOSTS.items():
        register_host(name, queues=["typed"], devices=["0", "1"], celery_name=f"celery@{name}", gpu_type=gpu_type, session=db)
        _sent(launcher.app, name)  # the in-memory broker outlives a test: start from an empty queue
    return Parts(
        db, config, _reconciler(launcher, config), Scheduler(launcher, CHECKPOINTS),
        Actor(launcher, Gangs(launcher), config, LOG, token=lambda ti_id: f"token-{ti_id}"),
    )


@pytest.fixture
def executor(executor_for, monkeypatch):
    """A real QuotaExecutor on the Celery launcher, whose ``queue_workload`` records jobs as Airflow queues them."""
    monkeypatch.setenv("AIRFLOW__QUOTA__LAUNCHER", "celery")
    return executor_for(QUOTAS)


def _sent(app, host: str) -> list[dict[str, str]]:
    """The environments of the launches published to ``host``'s queue."""
    out = []
    with app.connection_for_read() as broker, broker.SimpleQueue(host_queue(host)) as queue:
        while True:
            try:
                message = queue.get(timeout=0.05)
            except queue.Empty:
                return out
            out.append(json.loads(message.body)[0][2])
            message.ack()


def _asks(db, executor, task_id: str, gpu_type=None, *, quota: str = "team-a", gpus: int = 1) -> QuotaJob:
    asked = {"gpus": gpus} if gpu_type is None else {"gpus": gpus, "gpu_type": gpu_type}
    executor.queue_workload(_airflow_queues(db, task_id, quota=quota, priority=1, executor_config={"quota": asked}), db)
    return db.scalar(select(QuotaJob).where(QuotaJob.task_id == task_id))


def test_a_job_asking_for_a_type_runs_on_a_host_of_that_type_and_is_told_it(db, parts, executor):
    job = _asks(db, executor, "on_a100", "a100")
    assert json.loads(job.gpu_types) == ["a100"]
    parts.decide_and_act()
    assert (job.state, job.host, job.gpu_type, devices_of(job.id, session=db)) == (
        JobState.RUNNING.value, "types-a100", "a100", ["0"]
    )
    (admitted,) = db.scalars(select(QuotaEvent.message).where(QuotaEvent.job_id == job.id, QuotaEvent.kind == "admitted"))
    assert admitted == "by scheduler job 7; GPU type a100"
    (env,) = _sent(parts.actor.launcher.app, "types-a100")
    assert TaskEnvironment.read(env).gpu_type == "a100"
    assert _sent(parts.actor.launcher.app, "types-h100") == []


def test_a_job_takes_the_first_of_its_types_the_job_queue_has(db, parts, executor):
    job = _asks(db, executor, "l4_or_a100", ["l4", "a100"])
    parts.decide_and_act()
    assert (job.state, job.host, job.gpu_type) == (JobState.RUNNING.value, "types-a100", "a100")


def test_an_untyped_job_takes_the_first_type_with_room_in_the_queues_order(db, parts, executor):
    first = _asks(db, executor, "first")
    parts.decide_and_act()
    assert (first.host, first.gpu_type) == ("types-h100", "h100"), "h100 comes first in the job queue"
    other = _asks(db, executor, "other", "h100", quota="team-b")
    parts.decide_and_act()
    assert (other.host, other.gpu_type) == ("types-h100", "h100")

    untyped = _asks(db, executor, "untyped")  # h100 is full: the running jobs count on their type
    parts.decide_and_act()
    assert (untyped.state, untyped.host, untyped.gpu_type) == (JobState.RUNNING.value, "types-a100", "a100")
    assert TaskEnvironment.read(_sent(parts.actor.launcher.app, "types-a100")[0]).gpu_type == "a100"


def test_a_job_waits_for_its_type_while_the_other_type_has_room(db, parts, executor):
    holders = [_asks(db, executor, f"h100_{quota}", "h100", quota=quota) for quota in ("team-a", "team-b")]
    parts.decide_and_act()
    assert [j.host for j in holders] == ["types-h100", "types-h100"]
    waiting = _asks(db, executor, "waits", "h100")
    parts.decide_and_act()
    assert (waiting.state, waiting.gpu_type) == (JobState.PENDING.value, None)
    assert waiting.pending_reason.startswith("h100: quota team-a full: 1/1 GPUs"), waiting.pending_reason


def test_a_job_borrowing_on_its_type_is_recorded_with_that_types_capacity(db, parts, executor):
    own, borrower = _asks(db, executor, "own", "h100"), _asks(db, executor, "borrower", "h100")
    parts.decide_and_act()
    assert [(j.host, j.gpu_type) for j in (own, borrower)] == [("types-h100", "h100")] * 2
    (borrowed,) = db.scalars(select(QuotaEvent.message).where(QuotaEvent.kind == "borrowed"))
    assert borrowed == "quota team-a uses 2 of its 1 h100 GPUs"


def test_a_job_asking_only_for_types_the_queue_lacks_fails_naming_the_queues_types(db, parts, executor):
    job = _asks(db, executor, "on_l4", "l4")
    parts.decide_and_act()
    assert (job.state, _ti_state(db, job)) == (JobState.FAILED.value, TaskInstanceState.FAILED)
    assert job.message == "gpu_type: l4 is not one of this job queue's GPU types (h100, a100)"


def test_a_type_no_host_has_registered_yet_keeps_its_jobs_waiting(db, parts, executor):
    db.execute(update(QuotaHost).where(QuotaHost.name == "types-a100").values(queues="elsewhere"))
    job = _asks(db, executor, "early", "a100")
    parts.decide_and_act()
    assert (job.state, job.report) == (JobState.PENDING.value, None), job.message
    assert job.pending_reason.startswith("a100: no host has 1 free GPU"), job.pending_reason
    assert "(no a100 GPU host registered yet) down" in job.pending_reason


def test_a_running_job_without_a_gpu_type_counts_on_its_hosts_type(db, parts, executor):
    """A job admitted before the queue had types (its row has no type) holds both GPUs of types-h100:
    h100 counts them, so an untyped job takes a100, not GPUs of types-h100 that are held."""
    before = _asks(db, executor, "before_types", "h100", gpus=2)
    parts.decide_and_act()
    assert (before.state, before.host) == (JobState.RUNNING.value, "types-h100")
    db.execute(update(QuotaJob).where(QuotaJob.id == before.id).values(gpu_type=None))
    untyped = _asks(db, executor, "untyped", quota="team-b")
    parts.decide_and_act()
    assert (untyped.state, untyped.host, untyped.gpu_type) == (JobState.RUNNING.value, "types-a100", "a100")


def test_a_host_of_none_of_the_queues_types_holds_no_job_is_logged_once_and_named_in_waiting_reasons(
    db, parts, executor, caplog
):
    register_host("types-none", queues=["typed"], devices=["0", "1", "2", "3"], celery_name="celery@types-none", session=db)
    holders = [_asks(db, executor, f"h100_{quota}", "h100", quota=quota) for quota in ("team-a", "team-b")]
    parts.decide_and_act()
    waiting = _asks(db, executor, "waits", "h100")
    parts.decide_and_act()
    assert [j.host for j in holders] == ["types-h100", "types-h100"]
    assert waiting.state == JobState.PENDING.value
    assert waiting.pending_reason.startswith("h100: ") and waiting.pending_reason.endswith(
        "; counted for no GPU type: hosts of none of this job queue's GPU types (h100, a100): types-none (GPU type none)"
    ), waiting.pending_reason
    told = [r.getMessage() for r in caplog.records if "types-none" in r.getMessage()]
    assert told == [
        "Host types-none has GPU type None; job queue typed lists h100, a100: its GPUs count for none of them and "
        "no job starts there until its worker starts again with --gpu-type (one of them)"
    ]


def test_the_type_is_forgotten_with_the_devices(db, parts, executor):
    job = _asks(db, executor, "ends", "a100")
    parts.decide_and_act()
    _started(db, job)
    end_launch(job.handle, rc=0, session=db)
    db.execute(update(TaskInstance).where(TaskInstance.task_id == job.task_id).values(state=TaskInstanceState.SUCCESS))
    assert parts.reconciler.watch_launches(parts.cycle())
    assert (job.state, job.gpu_type, json.loads(job.gpu_types)) == (JobState.FINISHED.value, None, ["a100"])


def test_hosts_say_their_type_to_the_scheduler(db, parts):
    hosts = parts.actor.launcher.hosts(parts.config.quota_file, session=db)
    assert {(h.name, h.gpu_type) for h in hosts} == set(HOSTS.items())


# ------------------------------------------------------------------------ the local launcher


ONE_TYPE = "queues:\n- name: q\n  capacity: {h100: 2}\n  quotas: [{name: team-a, capacity: {h100: 2}}]\n"


@pytest.mark.parametrize(
    ("quotas", "gpu_type", "message"),
    [
        pytest.param(ONE_TYPE, None, "job queue q has GPU types (h100): the local launcher needs [quota] gpu_type", id="no type"),
        pytest.param(
            QUOTAS, "h100",
            "job queue typed has GPU types h100, a100, but the local launcher runs on one machine of GPU type h100",
            id="a type the machine lacks",
        ),
        pytest.param(
            ONE_TYPE, "a100", "job queue q has GPU types h100, but the local launcher runs on one machine of GPU type a100",
            id="another type",
        ),
    ],
)
def test_the_local_launchers_machine_must_be_of_its_typed_queues_one_type(tmp_path, quotas, gpu_type, message):
    (tmp_path / "quotas.yaml").write_text(quotas)
    with pytest.raises(QuotaConfigError, match=re.escape(f"queues[0].capacity: {message}")):
        QuotaConfig(str(tmp_path / "quotas.yaml"), ["0", "1", "2", "3"], gpu_type=gpu_type, pools=dict)


def test_the_local_launcher_runs_a_queue_of_its_machines_type(tmp_path):
    from airflow_quota_provider.executors.local_launcher import LocalLauncher

    (tmp_path / "quotas.yaml").write_text(ONE_TYPE)
    config = QuotaConfig(str(tmp_path / "quotas.yaml"), ["0", "1"], gpu_type="h100", pools=dict)
    launcher = LocalLauncher(tmp_path / "state", config.devices, gpu_type=config.gpu_type, cgroups=False)
    assert [(h.queue, h.devices, h.gpu_type) for h in launcher.hosts(config.quota_file, session=None)] == [("q", ("0", "1"), "h100")]


def test_a_scheduler_on_the_local_launcher_takes_its_type_from_the_config_and_refuses_to_start_without(
    executor_for, monkeypatch
):
    monkeypatch.setenv("AIRFLOW__QUOTA__VIRTUAL_GPUS", "2")
    with pytest.raises(SystemExit, match=re.escape("the local launcher needs [quota] gpu_type")):
        executor_for(ONE_TYPE)
    monkeypatch.setenv("AIRFLOW__QUOTA__GPU_TYPE", "h100")
    assert executor_for(ONE_TYPE).config.gpu_type == "h100"
