"""@task.quota: registration, arguments, and preemption of a Python callable in a real task context."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.operators.quota_airflow import (  # first: it keeps Airflow away from ~/airflow
    make_airflow_home,
    read_events,
    wait_for,
    write_preempt_file,
)
from airflow.sdk import DAG

from airflow_quota_provider.decorators.quota import quota_task
from airflow_quota_provider.get_provider_info import get_provider_info
from airflow_quota_provider.operators.training import QuotaTaskArgumentError
from airflow_quota_provider.protocol import EXECUTOR_CONFIG_KEY


def test_provider_registers_the_quota_decorator():
    entries = get_provider_info()["task-decorators"]
    assert {"class-name": "airflow_quota_provider.decorators.quota.quota_task", "name": "quota"} in entries


def test_decorated_task_gets_quota_pool_priority_and_executor_config():
    with DAG("deco_args"):

        @quota_task(quota="inference", gpus=2, priority=30, max_preemptions=1, grace_period=15)
        def score(quota=None):
            return 1

        op = score().operator
    assert (op.pool, op.pool_slots, op.priority_weight, op.executor) == ("inference", 2, 30, "quota")
    assert op.executor_config[EXECUTOR_CONFIG_KEY] == {
        "preemptible": True,
        "max_preemptions": 1,
        "grace_period_s": 15.0,
    }


def test_a_decorated_task_asks_for_gpu_types_in_its_executor_config():
    with DAG("deco_typed"):

        @quota_task(quota="inference", gpu_type=["l4", "a100"])
        def score(quota=None):
            return 1

        op = score().operator
    assert op.executor_config[EXECUTOR_CONFIG_KEY]["gpu_type"] == ["l4", "a100"]


GANG_REFUSED = r"^nodes: 2 is not 1; nodes > 1 needs a command every host runs: use QuotaTrainingOperator$"


def test_a_decorated_gang_is_refused_when_the_dag_is_parsed():
    """A gang's other nodes run node 0's command; a Python callable is none they could run."""
    with DAG("deco_gang"), pytest.raises(QuotaTaskArgumentError, match=GANG_REFUSED) as err:

        @quota_task(quota="team-a", gpus=8, nodes=2)
        def pretrain(quota=None):
            return 1

    assert err.value.field == "nodes"


def test_a_decorated_task_overridden_into_a_gang_is_refused():
    with DAG("deco_override_gang"):

        @quota_task(quota="team-a", gpus=8)
        def pretrain(quota=None):
            return 1

        with pytest.raises(QuotaTaskArgumentError, match=GANG_REFUSED):
            pretrain.override(nodes=2)()
        assert pretrain.override(nodes=1)().operator.pool_slots == 8


def test_mapped_decorated_task_knows_its_quota_pool_before_unmapping():
    with DAG("deco_mapped"):

        @quota_task(quota="inference", gpus=1, priority=30)
        def score(shard: int, quota=None):
            return shard

        mapped = score.expand(shard=[0, 1, 2])
    op = mapped.operator
    assert (op.pool, op.pool_slots, op.priority_weight, op.executor) == ("inference", 1, 30, "quota")
    assert op.executor_config[EXECUTOR_CONFIG_KEY]["preemptible"] is True


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"on_preempt": "sometimes"}, "on_preempt", id="unknown on_preempt value"),
        pytest.param({"gpus": -2}, "gpus", id="negative gpus"),
        pytest.param({"nodes": 0}, "nodes", id="zero nodes"),
        pytest.param({"nodes": 2000}, "nodes", id="more nodes than the bound"),
        pytest.param({"priority": "high"}, "priority", id="priority not an integer"),
        pytest.param({"gpu_type": []}, "gpu_type", id="no GPU type in a list"),
        pytest.param({"gpu_type": 4}, "gpu_type", id="a GPU type that is a number"),
    ],
)
def test_bad_decorator_argument_names_the_field(kwargs, field):
    with DAG("deco_bad"), pytest.raises(QuotaTaskArgumentError) as err:

        @quota_task(**{"quota": "inference", **kwargs})
        def score(quota=None):
            return 1

        score()
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


DAG_SOURCE = """
import json, os, time
from airflow.sdk import DAG, task
from airflow_quota_provider.decorators.quota import QuotaPreempted, current_quota_run

EVENTS = {events!r}

def emit(**record):
    with open(EVENTS, "a") as f:
        f.write(json.dumps({{"pid": os.getpid(), "time": time.time(), **record}}) + "\\n")

def load(quota):
    return json.loads(quota.resume_from.read_text())["step"] if quota.resume_from else 0

def save(quota, task, step):
    path = quota.checkpoint_dir / f"step-{{step:06d}}.json"
    path.write_text(json.dumps({{"step": step}}))
    emit(task=task, event="checkpoint", step=step, path=str(path))

with DAG("deco_preempt", schedule=None) as dag:

    @task.quota(quota="inference", gpus=1, priority=30, grace_period=30)
    def interrupted(quota=None):
        step = load(quota)
        emit(task="interrupted", event="start", step=step, resume_from=str(quota.resume_from or ""),
             env_dir=os.environ["QUOTA_CHECKPOINT_DIR"], same=current_quota_run() is quota)
        try:
            while step < 40:
                step += 1
                if step % 5 == 0:
                    save(quota, "interrupted", step)
                time.sleep(0.1)
        except QuotaPreempted as e:
            emit(task="interrupted", event="preempted", step=step, reason=e.notice.reason)
            raise
        finally:
            save(quota, "interrupted", step)
        return step

    @task.quota(quota="inference", gpus=1, priority=30, grace_period=30, on_preempt="flag")
    def cooperative(quota=None):
        step = load(quota)
        emit(task="cooperative", event="start", step=step, resume_from=str(quota.resume_from or ""))
        while step < 40:
            if quota.preempt_requested:
                emit(task="cooperative", event="flag", step=step)
                save(quota, "cooperative", step)
                return "stopped early"
            step += 1
            if step % 5 == 0:
                save(quota, "cooperative", step)
            time.sleep(0.1)
        return step

    interrupted() >> cooperative()
"""


def test_preempted_callables_are_rescheduled_and_resume(tmp_path_factory, tmp_path):
    """``raise`` mode gets QuotaPreempted mid-loop; ``flag`` mode sees quota.preempt_requested. Both
    runs end UP_FOR_RESCHEDULE with try_number 1, and the next attempt resumes from the checkpoint."""
    home = make_airflow_home(tmp_path_factory.mktemp("quota-deco-home"))
    events, preempt = tmp_path / "events.jsonl", tmp_path / "preempt.json"
    home.write_dag("deco_preempt", DAG_SOURCE.format(events=str(events)))
    run = home.start_dag_test("deco_preempt", {"QUOTA_PREEMPT_FILE": str(preempt)})

    for task_id in ("interrupted", "cooperative"):
        wait_for(
            lambda: any(e["task"] == task_id and e["event"] == "checkpoint" for e in read_events(events)),
            f"{task_id} to checkpoint",
            run=run,
        )
        write_preempt_file(preempt, reason="within_quota", preemptor="eval-hi", deadline=time.time() + 30)
        wait_for(lambda: not preempt.exists(), f"{task_id} to acknowledge the notice", run=run)
    result = run.wait()

    assert result["attempts"] == [
        {"task_id": "interrupted", "state": "up_for_reschedule", "try_number": 1},
        {"task_id": "interrupted", "state": "success", "try_number": 1},
        {"task_id": "cooperative", "state": "up_for_reschedule", "try_number": 1},
        {"task_id": "cooperative", "state": "success", "try_number": 1},
    ]
    assert result["reschedules"] == {"interrupted": 1, "cooperative": 1}
    log = read_events(events)
    for task_id, stop_event in (("interrupted", "preempted"), ("cooperative", "flag")):
        mine = [e for e in log if e["task"] == task_id]
        starts = [e for e in mine if e["event"] == "start"]
        stopped = next(e for e in mine if e["event"] == stop_event)
        last_before_restart = [e for e in mine if e["event"] == "checkpoint" and e["time"] < starts[1]["time"]][-1]
        assert len(starts) == 2 and starts[0]["resume_from"] == ""
        assert last_before_restart["step"] == stopped["step"]
        assert starts[1]["resume_from"] == last_before_restart["path"]
        assert starts[1]["step"] == stopped["step"] > 0
    first = next(e for e in log if e["task"] == "interrupted" and e["event"] == "start")
    first_checkpoint = next(e for e in log if e["task"] == "interrupted" and e["event"] == "checkpoint")
    assert first["same"] is True  # current_quota_run() is the quota argument
    assert first["env_dir"] == str(Path(first_checkpoint["path"]).parent)  # QUOTA_CHECKPOINT_DIR


STORE_DAG_SOURCE = """
import json, os, time

import fsspec
from airflow.sdk import DAG, task
from airflow.sdk.io import attach

# The "remote" store: fsspec's memory filesystem, shared by the attempts of this (driver) process.
attach("memory", fs=fsspec.filesystem("memory"))
EVENTS = {events!r}

def emit(**record):
    with open(EVENTS, "a") as f:
        f.write(json.dumps({{"pid": os.getpid(), "time": time.time(), **record}}) + "\\n")

def save(quota, step):
    path = quota.checkpoint_dir / f"step-{{step:06d}}.json"
    path.write_text(json.dumps({{"step": step}}))
    emit(event="checkpoint", step=step, path=str(path))

with DAG("deco_store", schedule=None) as dag:

    @task.quota(quota="inference", gpus=1, priority=30, grace_period=30)
    def interrupted(quota=None):
        step = json.loads(quota.resume_from.read_text())["step"] if quota.resume_from else 0
        emit(event="start", step=step, dir=str(quota.checkpoint_dir), resume_from=str(quota.resume_from or ""),
             remote=str(quota.sync.remote))
        try:
            while step < 40:
                step += 1
                if step % 5 == 0:
                    save(quota, step)
                time.sleep(0.1)
        finally:
            save(quota, step)
        return step

    @task
    def list_store():
        with open({listing!r}, "w") as f:
            json.dump(sorted(p for p in fsspec.filesystem("memory").find("/deco-bucket") if "/." not in p), f)

    interrupted() >> list_store()
"""


def test_preempted_callable_resumes_from_the_object_store_in_a_fresh_working_copy(tmp_path_factory, tmp_path):
    """With ``[quota] checkpoint_root`` in an object store, ``quota.checkpoint_dir`` is a local working
    copy: the newest checkpoint is uploaded when the callable is preempted, and the next run downloads it."""
    home = make_airflow_home(tmp_path_factory.mktemp("quota-deco-store-home"))
    events, preempt, listing = tmp_path / "events.jsonl", tmp_path / "preempt.json", tmp_path / "listing.json"
    home.write_dag("deco_store", STORE_DAG_SOURCE.format(events=str(events), listing=str(listing)))
    run = home.start_dag_test(
        "deco_store",
        {"QUOTA_PREEMPT_FILE": str(preempt), "AIRFLOW__QUOTA__CHECKPOINT_ROOT": "memory://deco-bucket/airflow"},
        supervise=False,  # the memory store lives in the driver process
    )
    wait_for(lambda: any(e["event"] == "checkpoint" for e in read_events(events)), "a checkpoint", run=run)
    write_preempt_file(preempt, reason="within_quota", preemptor="eval-hi", deadline=time.time() + 30)
    result = run.wait()

    assert [(a["task_id"], a["state"], a["try_number"]) for a in result["attempts"]] == [
        ("interrupted", "up_for_reschedule", 1),
        ("interrupted", "success", 1),
        ("list_store", "success", 1),
    ]
    log = read_events(events)
    starts = [e for e in log if e["event"] == "start"]
    stopped = [e for e in log if e["event"] == "checkpoint" and e["time"] < starts[1]["time"]][-1]
    assert starts[0]["resume_from"] == "" and starts[1]["step"] == stopped["step"] > 0
    assert starts[0]["dir"] != starts[1]["dir"]  # a fresh working copy: the checkpoint came from the store
    assert starts[1]["resume_from"] == str(Path(starts[1]["dir"]) / Path(stopped["path"]).name)
    assert starts[0]["remote"] == starts[1]["remote"]
    assert starts[0]["remote"].startswith("memory://deco-bucket/airflow/deco_store/manual__")
    assert starts[0]["remote"].endswith("/interrupted")
    assert not Path(starts[0]["dir"]).exists() and not Path(starts[1]["dir"]).exists()

    names = [Path(p).name for p in json.loads(listing.read_text())]
    first_run = [n for n in names if int(n[5:11]) <= stopped["step"]]
    assert first_run == [Path(stopped["path"]).name]  # preempted: only the newest was uploaded
    assert names[-1] == "step-000040.json"
