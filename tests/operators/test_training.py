"""QuotaTrainingOperator: arguments, and preemption end to end in a real Airflow task context.

The end-to-end cases run the operator through ``dag.test()`` against a temporary SQLite
AIRFLOW_HOME, start real commands (the example PyTorch script), write the executor's preempt file
and read the task instance back from the metadata DB after every attempt.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest

from tests.operators.quota_airflow import (  # first: it keeps Airflow away from ~/airflow
    TRAIN_SCRIPT,
    make_airflow_home,
    read_events,
    wait_for,
    write_preempt_file,
)
from airflow_quota_provider.operators.arguments import QuotaTaskArgumentError, quota_operator_kwargs
from airflow_quota_provider.operators.checkpoints import latest_checkpoint
from airflow_quota_provider.operators.quota_run import QuotaRun
from airflow_quota_provider.operators.training import QuotaTrainingOperator
from airflow_quota_provider.protocol import (
    EXECUTOR_CONFIG_KEY,
    GANG_NODE_FAILED,
    GANG_XCOM_KEY,
    GangCommand,
    GangEnvironment,
    PreemptionNotice,
    write_notice,
)


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory):
    return make_airflow_home(tmp_path_factory.mktemp("quota-ops-home"))


# ---------------------------------------------------------------------------------------------
# Arguments


def test_quota_arguments_map_to_pool_slots_priority_and_executor_config():
    op = QuotaTrainingOperator(
        task_id="train",
        quota="team-a",
        gpus=4,
        priority=50,
        command="python train.py",
        max_preemptions=3,
        grace_period=timedelta(minutes=2),
        preemptible=False,
        executor_config={"other": 1},
    )
    assert (op.pool, op.pool_slots, op.priority_weight, str(op.weight_rule)) == ("team-a", 4, 50, "absolute")
    assert op.executor == "quota"
    assert op.executor_config == {
        "other": 1,
        EXECUTOR_CONFIG_KEY: {"preemptible": False, "max_preemptions": 3, "grace_period_s": 120.0},
    }


def test_one_node_maps_to_exactly_the_arguments_of_a_job_on_one_host():
    """``nodes=1`` (the default) changes nothing a DAG serializes: same pool slots, same executor_config."""
    args = {"quota": "team-a", "gpus": 4, "priority": 50, "preemptible": True, "max_preemptions": 3,
            "grace_period": 120, "expected_runtime": 600, "executor": "quota",
            "kwargs": {"retries": 0, "executor_config": {"other": 1}}}  # fmt: skip
    expected = {
        "retries": 0,
        "pool": "team-a",
        "pool_slots": 4,
        "priority_weight": 50,
        "weight_rule": "absolute",
        "executor": "quota",
        "executor_config": {
            "other": 1,
            EXECUTOR_CONFIG_KEY: {
                "preemptible": True,
                "max_preemptions": 3,
                "grace_period_s": 120.0,
                "expected_runtime_s": 600.0,
            },
        },
    }
    assert quota_operator_kwargs(**args) == expected
    assert quota_operator_kwargs(**args, nodes=1) == expected


def test_a_gang_counts_every_nodes_gpus_and_tells_the_executor_its_gpus_per_host():
    op = QuotaTrainingOperator(task_id="pretrain", quota="team-a", gpus=8, nodes=4, priority=60, command="torchrun")
    assert (op.pool_slots, op.gpus, op.nodes) == (32, 8, 4)
    assert op.executor_config[EXECUTOR_CONFIG_KEY] == {
        "preemptible": True,
        "max_preemptions": None,
        "grace_period_s": None,
        "gpus": 8,
        "nodes": 4,
    }


@pytest.mark.parametrize(("gpu_type", "written"), [("h100", "h100"), (["h100", "a100"], ["h100", "a100"]), (("l4",), "l4")])
def test_a_gpu_type_travels_to_the_executor_as_given(gpu_type, written):
    op = QuotaTrainingOperator(task_id="train", quota="team-a", command="python train.py", gpu_type=gpu_type)
    assert op.executor_config[EXECUTOR_CONFIG_KEY]["gpu_type"] == written
    assert "gpu_type" not in QuotaTrainingOperator(task_id="t", quota="team-a", command="true").executor_config[EXECUTOR_CONFIG_KEY]


def test_a_mapped_task_knows_its_gpu_type_before_unmapping():
    from airflow.sdk import DAG

    with DAG("mapped_typed"):
        mapped = QuotaTrainingOperator.partial(task_id="sweep", quota="team-b", gpu_type=["a100", "l4"]).expand(
            command=["a", "b"]
        )
    assert mapped.executor_config[EXECUTOR_CONFIG_KEY]["gpu_type"] == ["a100", "l4"]


def test_an_expected_runtime_travels_to_the_executor_and_overrides_the_history():
    op = QuotaTrainingOperator(
        task_id="train", quota="team-a", command="python train.py", expected_runtime=timedelta(minutes=30)
    )
    assert op.executor_config[EXECUTOR_CONFIG_KEY]["expected_runtime_s"] == 1800.0
    with pytest.raises(QuotaTaskArgumentError, match="expected_runtime: 0 is not a number of seconds > 0"):
        QuotaTrainingOperator(task_id="t", quota="team-a", command="true", expected_runtime=0)


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        pytest.param({"gpus": -1}, "gpus", "-1 is not an integer >= 1", id="negative gpus"),
        pytest.param({"gpus": 0}, "gpus", "0 is not an integer >= 1", id="zero gpus"),
        pytest.param({"gpus": 1.5}, "gpus", "1.5 is not an integer", id="fractional gpus"),
        pytest.param({"gpus": True}, "gpus", "True is not an integer", id="boolean gpus"),
        pytest.param({"nodes": 0}, "nodes", "0 is not an integer from 1 to 1024", id="zero nodes"),
        pytest.param({"nodes": 1025}, "nodes", "1025 is not an integer from 1 to 1024", id="more nodes than the bound"),
        pytest.param({"nodes": "4"}, "nodes", "'4' is not an integer", id="nodes as a string"),
        pytest.param({"nodes": True}, "nodes", "True is not an integer", id="boolean nodes"),
        pytest.param({"priority": -5}, "priority", "-5 is not an integer >= 0", id="negative priority"),
        *(
            pytest.param(
                {"gpu_type": value},
                "gpu_type",
                f"{value!r} is not a GPU type name (letters, digits, '.', '-', '_', at most 64) or a non-empty list "
                "of distinct ones or None",
                id=f"gpu_type {why}",
            )
            for value, why in (([], "an empty list"), ("", "empty"), (["h100", "h100"], "a type twice"),
                               (100, "a number"), ("h100 sxm", "with a space"), ({"h100": 1}, "a mapping"))
        ),
        pytest.param({"quota": ""}, "quota", "is not a quota name", id="empty quota"),
        pytest.param({"quota": "team a"}, "quota", "'team a' is not a quota name", id="quota with a space"),
        pytest.param({"max_preemptions": -1}, "max_preemptions", "or None", id="negative max_preemptions"),
        pytest.param({"grace_period": 0}, "grace_period", "> 0", id="zero grace period"),
        pytest.param({"grace_period": "2m"}, "grace_period", "'2m' is not a number", id="grace period string"),
        pytest.param({"preemptible": "yes"}, "preemptible", "not True or False", id="preemptible not bool"),
        pytest.param({"command": "  "}, "command", "is empty", id="empty command"),
        pytest.param({"command": []}, "command", "not a string or a non-empty list", id="empty argv"),
        pytest.param({"pool": "team-b"}, "pool", "conflicts with quota='team-a'", id="pool disagrees"),
        pytest.param({"pool_slots": 2}, "pool_slots", "conflicts with gpus=1", id="pool_slots disagrees"),
        pytest.param(
            {"gpus": 2, "nodes": 3, "pool_slots": 2},
            "pool_slots",
            "2 conflicts with gpus=2 x nodes=3; set gpus and nodes only",
            id="pool_slots of one node of a gang",
        ),
        pytest.param({"priority_weight": 9}, "priority_weight", "conflicts with priority=0", id="weight disagrees"),
        pytest.param({"weight_rule": "downstream"}, "weight_rule", "'absolute'", id="relative weight rule"),
        pytest.param(
            {"executor_config": {"quota": {"gpus": 3}}},
            "executor_config.quota",
            "set by the quota arguments",
            id="executor_config quota key",
        ),
    ],
)
def test_bad_argument_error_names_the_field(kwargs, field, fragment):
    args = {"task_id": "train", "quota": "team-a", "command": "true", **kwargs}
    with pytest.raises(QuotaTaskArgumentError) as err:
        QuotaTrainingOperator(**args)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")
    assert fragment in str(err.value)


def test_latest_checkpoint_is_newest_complete_entry(tmp_path):
    assert latest_checkpoint(tmp_path / "missing") is None
    assert latest_checkpoint(tmp_path) is None
    old, new = tmp_path / "ckpt-00000010.pt", tmp_path / "ckpt-00000020.pt"
    old.write_text("old")
    new.write_text("new")
    os.utime(old, (1000, 1000))
    os.utime(new, (2000, 2000))
    (tmp_path / ".ckpt-00000030.pt.tmp").write_text("in progress")
    (tmp_path / "ckpt-00000040.pt.partial").write_text("in progress")
    assert latest_checkpoint(tmp_path) == new


@pytest.mark.parametrize(
    ("env_grace", "task_grace", "deadline_in", "expected"),
    [
        pytest.param("45", 10.0, None, 45.0, id="executor's grace period wins over the task's"),
        pytest.param("", 10.0, None, 10.0, id="task's grace period without the executor's"),
        pytest.param("", None, None, 120.0, id="default grace period"),
        pytest.param("45", 10.0, 20.0, 19.0, id="deadline caps the grace period, less a margin"),
    ],
)
def test_stop_time_follows_grace_period_and_deadline(monkeypatch, tmp_path, env_grace, task_grace, deadline_in, expected):
    monkeypatch.setenv("QUOTA_GRACE_PERIOD_S", env_grace)
    monkeypatch.setenv("QUOTA_PREEMPT_FILE", str(tmp_path / "preempt.json"))
    run = QuotaRun.prepare(checkpoint_dir=tmp_path / "ckpt", grace_period_s=task_grace)
    now = 1_000_000.0
    if deadline_in is not None:
        (tmp_path / "preempt.json").write_text(json.dumps({"reason": "reclaim", "deadline": now + deadline_in}))
        assert run.preempt_requested
    assert run.stop_at(now) - now == pytest.approx(expected)


# ---------------------------------------------------------------------------------------------
# End to end through dag.test()


def test_preempted_training_checkpoints_is_rescheduled_and_resumes(airflow_home, tmp_path):
    """SIGTERM reaches the PyTorch script, it checkpoints and exits within the grace period; the
    task instance goes UP_FOR_RESCHEDULE with try_number 1; the next attempt resumes and succeeds."""
    dag_id = "preempt_training"
    events, preempt = tmp_path / "events.jsonl", tmp_path / "preempt.json"
    airflow_home.write_dag(
        dag_id,
        f"""
        from airflow.sdk import DAG
        from airflow_quota_provider.operators.training import QuotaTrainingOperator

        with DAG("{dag_id}", schedule=None, params={{"ckpt_root": "{tmp_path / 'ckpt'}"}}) as dag:
            QuotaTrainingOperator(
                task_id="train",
                quota="team-b",
                gpus=1,
                priority=10,
                command=(
                    "{sys.executable} {TRAIN_SCRIPT} --steps 150 --checkpoint-every 20"
                    " --step-sleep 0.02 --threads 1 --events {events} --seed {{{{ params.get('seed', 7) }}}}"
                ),
                checkpoint_dir="{{{{ params.ckpt_root }}}}/{{{{ dag.dag_id }}}}/{{{{ task.task_id }}}}",
                grace_period=60,
                retries=0,
            )
        """,
    )
    run = airflow_home.start_dag_test(
        dag_id,
        {"QUOTA_PREEMPT_FILE": str(preempt), "CUDA_VISIBLE_DEVICES": "3", "QUOTA_PREEMPTION_COUNT": "2"},
    )
    wait_for(
        lambda: any(e["event"] == "checkpoint" for e in read_events(events)),
        "the first periodic checkpoint",
        run=run,
    )
    write_preempt_file(preempt, reason="reclaim", preemptor="team-a/job-7", deadline=time.time() + 60)
    result = run.wait()
    output = run.output()

    assert result["attempts"] == [
        {"task_id": "train", "state": "up_for_reschedule", "try_number": 1},
        {"task_id": "train", "state": "success", "try_number": 1},
    ]
    assert result["final"]["train"]["state"] == "success"
    assert result["final"]["train"]["try_number"] == 1
    assert result["reschedules"]["train"] == 1
    assert "Command stopped within the grace period" in output
    assert "SIGKILL" not in output
    assert not preempt.exists() and Path(f"{preempt}.handled").exists()

    log = read_events(events)
    starts = [e for e in log if e["event"] == "start"]
    assert len(starts) == 2
    first_pid, second_pid = starts[0]["pid"], starts[1]["pid"]
    first = [e for e in log if e["pid"] == first_pid]
    second = [e for e in log if e["pid"] == second_pid]
    assert [e["event"] for e in first[-3:]] == ["sigterm", "checkpoint", "exit"]
    stop_checkpoint = first[-2]
    assert stop_checkpoint["reason"] == "sigterm" and first[-1]["code"] == 143
    ckpt_dir = tmp_path / "ckpt" / dag_id / "train"  # checkpoint_dir was rendered
    assert Path(stop_checkpoint["path"]).parent == ckpt_dir / "attempt-00001"  # each attempt writes its own
    assert Path(second[-2]["path"]).parent == ckpt_dir / "attempt-00002"
    assert starts[0]["resume_from"] == ""
    assert starts[1]["resume_from"] == stop_checkpoint["path"]
    assert starts[1]["start_step"] == stop_checkpoint["step"] > 0
    assert (starts[0]["cuda_visible_devices"], starts[0]["preemption_count"]) == ("3", 2)
    assert second[-1] == {**second[-1], "event": "exit", "code": 0, "step": 150}
    assert latest_checkpoint(ckpt_dir).name == "ckpt-00000150.pt"


def _bash_dag(airflow_home, dag_id: str, command: str, **operator_args) -> None:
    args = "".join(f"        {k}={v!r},\n" for k, v in {"retries": 0, **operator_args}.items())
    airflow_home.write_dag(
        dag_id,
        f"""
from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

with DAG("{dag_id}", schedule=None) as dag:
    QuotaTrainingOperator(
        task_id="job",
        quota="team-a",
        command={command!r},
{args}    )
""",
    )


def _started_bash_task(
    airflow_home, tmp_path, dag_id: str, command: str, *, supervise=True, environ=None, **operator_args
):
    """Run a one-task DAG whose bash ``command`` touches ``MARKER`` when it has started; return once it has.

    A command that finds ``MARKER`` already there is a later attempt. ``supervise=False`` where the
    task process boundary does not matter (signals to the supervisor do), to keep the suite quick.
    ``environ``: more of the task's environment, as the executor sets it."""
    marker, preempt = tmp_path / "started", tmp_path / "preempt.json"
    _bash_dag(airflow_home, dag_id, command.replace("MARKER", str(marker)), **operator_args)
    environ = {"QUOTA_PREEMPT_FILE": str(preempt), **(environ or {})}
    run = airflow_home.start_dag_test(dag_id, environ, supervise=supervise)
    wait_for(marker.exists, "the command to start", run=run)
    return run, preempt


def test_command_that_ignores_sigterm_is_killed_after_grace_and_still_rescheduled(airflow_home, tmp_path):
    command = "if [ -e MARKER ]; then echo resumed; exit 0; fi; touch MARKER; trap '' TERM; sleep 120"
    run, preempt = _started_bash_task(
        airflow_home, tmp_path, "ignores_sigterm", command, supervise=False, grace_period=1
    )
    write_preempt_file(preempt, reason="within_quota", preemptor="j2", deadline=time.time() + 300)
    result = run.wait()
    assert [a["state"] for a in result["attempts"]] == ["up_for_reschedule", "success"]
    assert {a["try_number"] for a in result["attempts"]} == {1}
    output = run.output()
    assert "Command did not stop within the grace period; sending SIGKILL" in output
    assert "resumed" in output


def test_nonzero_exit_fails_with_the_exit_code_and_templated_env_renders(airflow_home):
    command = 'echo "tag=$RUN_TAG"; exit 3'
    _bash_dag(airflow_home, "exit_three", command, env={"RUN_TAG": "{{ dag.dag_id }}-{{ task.task_id }}"})
    run = airflow_home.start_dag_test("exit_three", supervise=False)
    result = run.wait()
    assert result["attempts"] == [{"task_id": "job", "state": "failed", "try_number": 1}]
    assert result["reschedules"]["job"] == 0
    output = run.output()
    assert "Command exited with code 3" in output
    assert "tag=exit_three-job" in output


def test_notice_past_the_preemption_limit_fails_the_task_with_its_message(airflow_home, tmp_path):
    command = "touch MARKER; trap 'echo saving; exit 143' TERM; sleep 120 & wait"
    run, preempt = _started_bash_task(
        airflow_home, tmp_path, "limit_reached", command, supervise=False, grace_period=30
    )
    notice = {"reason": "reclaim", "preemptor": "j5", "deadline": time.time() + 30, "fail": True,
              "message": "preempted 3 times: max_preemptions=3 reached"}
    preempt.write_text(json.dumps(notice))
    result = run.wait()
    assert result["attempts"] == [{"task_id": "job", "state": "failed", "try_number": 1}]
    assert result["reschedules"]["job"] == 0
    output = run.output()
    assert "saving" in output  # the command was asked to stop before the task failed
    assert "max_preemptions=3 reached" in output


def test_kill_without_a_notice_stops_the_command_and_fails(airflow_home, tmp_path):
    """SIGTERM to the task process (on_kill) with no preempt file is an ordinary kill, not a preemption."""
    got_term = tmp_path / "got-term"
    command = f"trap 'touch {got_term}; exit 0' TERM; touch MARKER; sleep 120 & wait"
    run, preempt = _started_bash_task(airflow_home, tmp_path, "killed", command, grace_period=30)
    os.kill(run.proc.pid, signal.SIGTERM)  # the supervisor: it forwards SIGTERM to the task process
    result = run.wait()
    assert got_term.exists() and not preempt.exists()
    assert result["attempts"] == [{"task_id": "job", "state": "failed", "try_number": 1}]
    assert "Command was terminated (task killed" in run.output()


def test_sigterm_after_the_notice_is_a_preemption_even_if_the_command_exits_zero(airflow_home, tmp_path):
    """An executor may write the notice and then SIGTERM the task process: that is a reschedule."""
    command = "if [ -e MARKER ]; then exit 0; fi; trap 'exit 0' TERM; touch MARKER; sleep 120 & wait"
    run, preempt = _started_bash_task(airflow_home, tmp_path, "notice_then_sigterm", command, grace_period=30)
    write_preempt_file(preempt, reason="reclaim", preemptor="j3", deadline=time.time() + 30)
    os.kill(run.proc.pid, signal.SIGTERM)  # to the supervisor, which forwards it
    result = run.wait()
    assert [(a["state"], a["try_number"]) for a in result["attempts"]] == [
        ("up_for_reschedule", 1),
        ("success", 1),
    ]


def test_mapped_commands_run_as_quota_tasks_with_a_checkpoint_dir_per_map_index(airflow_home, tmp_path):
    airflow_home.write_dag(
        "mapped_commands",
        f"""
        from airflow.sdk import DAG
        from airflow_quota_provider.operators.training import QuotaTrainingOperator

        with DAG("mapped_commands", schedule=None) as dag:
            QuotaTrainingOperator.partial(task_id="shard", quota="team-a", gpus=1, retries=0).expand(
                command=[f'echo "$QUOTA_CHECKPOINT_DIR" > {tmp_path}/' + name for name in ("a", "b")]
            )
        """,
    )
    result = airflow_home.start_dag_test("mapped_commands", supervise=False).wait()
    assert {k: v["state"] for k, v in result["final"].items()} == {"shard[0]": "success", "shard[1]": "success"}
    dirs = [Path((tmp_path / name).read_text().strip()) for name in ("a", "b")]
    assert [(d.parent.parent.name, d.parent.name, d.name) for d in dirs] == [
        ("shard", "0", "attempt-00001"),
        ("shard", "1", "attempt-00001"),
    ]
    assert all(d.is_dir() for d in dirs)


def test_mapped_operator_knows_its_quota_pool_and_gpus_before_unmapping():
    """The scheduler and the executor read a mapped task's pool and executor_config before unmapping."""
    from airflow.sdk import DAG

    with DAG("mapped_training"):
        mapped = QuotaTrainingOperator.partial(
            task_id="sweep", quota="team-b", gpus=2, priority=7, grace_period=45
        ).expand(command=["train --lr 0.1", "train --lr 0.01"])
    assert (mapped.pool, mapped.pool_slots, mapped.priority_weight, mapped.executor) == ("team-b", 2, 7, "quota")
    assert mapped.executor_config[EXECUTOR_CONFIG_KEY] == {
        "preemptible": True,
        "max_preemptions": None,
        "grace_period_s": 45.0,
    }
    with DAG("mapped_bad"), pytest.raises(QuotaTaskArgumentError, match=r"^gpus: -1 is not an integer >= 1"):
        QuotaTrainingOperator.partial(task_id="sweep", quota="team-b", gpus=-1).expand(command=["a"])


def test_mapped_gang_knows_its_gpus_and_nodes_before_unmapping():
    from airflow.sdk import DAG

    with DAG("mapped_gangs"):
        mapped = QuotaTrainingOperator.partial(task_id="sweep", quota="team-b", gpus=8, nodes=2).expand(
            command=["torchrun train.py --lr 0.1", "torchrun train.py --lr 0.01"]
        )
    asked = mapped.executor_config[EXECUTOR_CONFIG_KEY]
    assert (mapped.pool_slots, asked["gpus"], asked["nodes"]) == (16, 8, 2)
    with DAG("mapped_bad_gang"), pytest.raises(QuotaTaskArgumentError, match=r"^nodes: 0 is not an integer from 1"):
        QuotaTrainingOperator.partial(task_id="sweep", quota="team-b", nodes=0).expand(command=["a"])


def test_cwd_and_a_checkpoint_dir_url_are_templated(airflow_home, tmp_path):
    """``checkpoint_dir`` may be a URL (rendered first); a ``file://`` one is the command's directory."""
    airflow_home.write_dag(
        "templated_dirs",
        f"""
        from airflow.sdk import DAG
        from airflow_quota_provider.operators.training import QuotaTrainingOperator

        with DAG("templated_dirs", schedule=None, params={{"root": "{tmp_path}"}}) as dag:
            QuotaTrainingOperator(
                task_id="job",
                quota="team-a",
                command='pwd > out.txt; echo "$QUOTA_CHECKPOINT_DIR" >> out.txt',
                cwd="{{{{ params.root }}}}",
                checkpoint_dir="file://{{{{ params.root }}}}/ckpt/{{{{ task.task_id }}}}",
                retries=0,
            )
        """,
    )
    result = airflow_home.start_dag_test("templated_dirs", supervise=False).wait()
    assert result["final"]["job"]["state"] == "success"
    assert (tmp_path / "out.txt").read_text().split() == [str(tmp_path), str(tmp_path / "ckpt" / "job" / "attempt-00001")]
    assert QuotaTrainingOperator.template_fields == ("command", "checkpoint_dir", "env", "cwd")


GANG_NODE = GangEnvironment(
    nnodes=2, node_rank=1, nproc_per_node=4, master_addr="10.0.3.7", master_port=29500, rdzv_id="17"
)


def test_a_gang_node_passes_the_launchers_variables_to_its_command_unchanged(airflow_home, tmp_path):
    """The launcher sets the gang's variables in the task's environment; the command gets them as
    they are, even where the task's ``env`` names one (a node told another master hangs the gang)."""
    seen = tmp_path / "seen.json"
    command = f"""python3 -c 'import json, os; json.dump(dict(os.environ), open("{seen}", "w"))'"""
    _bash_dag(airflow_home, "gang_node", command, gpus=4, nodes=2, env={"MASTER_PORT": "1", "RUN_TAG": "mine"})
    run = airflow_home.start_dag_test("gang_node", GANG_NODE.to_env(), supervise=False)
    assert run.wait()["final"]["job"]["state"] == "success"
    environ = json.loads(seen.read_text())
    assert {k: environ.get(k) for k in GANG_NODE.to_env()} == GANG_NODE.to_env()
    assert environ["RUN_TAG"] == "mine"  # the task's other variables still reach it
    assert "Node 1 of a gang of 2 (8 processes in all, job 17); master 10.0.3.7:29500" in run.output()


def test_a_gang_node_without_its_rank_fails_before_its_command_starts(airflow_home, tmp_path):
    marker = tmp_path / "started"
    _bash_dag(airflow_home, "gang_no_rank", f"touch {marker}", gpus=4, nodes=2)
    environ = {k: v for k, v in GANG_NODE.to_env().items() if k != "QUOTA_NODE_RANK"}
    run = airflow_home.start_dag_test("gang_no_rank", environ, supervise=False)
    assert run.wait()["attempts"] == [{"task_id": "job", "state": "failed", "try_number": 1}]
    assert not marker.exists()
    assert "node_rank (QUOTA_NODE_RANK): is not set, but QUOTA_NNODES is" in run.output()


GANG_NODE_0 = GangEnvironment(
    nnodes=2, node_rank=0, nproc_per_node=4, master_addr="10.0.3.7", master_port=29500, rdzv_id="17"
)


def _xcoms(airflow_home, dag_id: str, key: str) -> list:
    """A DAG's XComs under ``key`` as the executor reads them: from Airflow's xcom table (JSON)."""
    with sqlite3.connect(airflow_home.root / "airflow.db") as db:
        rows = db.execute("SELECT value FROM xcom WHERE dag_id = ? AND key = ?", (dag_id, key)).fetchall()
    return [json.loads(value) for (value,) in rows]


def test_node_0_of_a_gang_publishes_its_rendered_command_without_airflows_environment(airflow_home, tmp_path):
    """The gang's other nodes are not Airflow tasks: they run what node 0 rendered, with node 0's
    ``env`` and QUOTA_* variables, but nothing of the task process's own environment (Airflow's
    tokens, the host's secrets) and none of node 0's gang variables (each node gets its own)."""
    command = "echo {{ dag.dag_id }} > node0.txt"
    env = {"RUN_TAG": "{{ task.task_id }}", "MASTER_PORT": "1"}
    _bash_dag(airflow_home, "gang_publish", command, gpus=4, nodes=2, env=env, cwd=str(tmp_path))
    environ = {**GANG_NODE_0.to_env(), "DB_PASSWORD": "hunter2", "QUOTA_PREEMPTION_COUNT": "1"}
    run = airflow_home.start_dag_test("gang_publish", environ, supervise=False)
    assert run.wait()["final"]["job"]["state"] == "success"

    [xcom] = _xcoms(airflow_home, "gang_publish", GANG_XCOM_KEY)
    published = GangCommand.from_dict(xcom)
    assert published.argv == ["bash", "-c", "echo gang_publish > node0.txt"]
    assert published.cwd == str(tmp_path)
    checkpoint_dir = published.env["QUOTA_CHECKPOINT_DIR"]
    assert published.env == {
        "RUN_TAG": "job",
        "QUOTA_CHECKPOINT_DIR": checkpoint_dir,
        "QUOTA_RESUME_FROM": "",
        "QUOTA_PREEMPTION_COUNT": "1",
    }
    assert Path(checkpoint_dir).name == "attempt-00001"
    assert not any(k.startswith("AIRFLOW") or "hunter2" in v for k, v in published.env.items())
    output = run.output()
    published_at = output.index("Published the command for the gang's other 1 node(s) as XCom 'quota_gang'")
    assert published_at < output.index("Started command")  # the members may start with node 0


def test_a_node_that_is_not_node_0_publishes_no_command(airflow_home):
    _bash_dag(airflow_home, "gang_rank_1", "true", gpus=4, nodes=2)
    run = airflow_home.start_dag_test("gang_rank_1", GANG_NODE.to_env(), supervise=False)
    assert run.wait()["final"]["job"]["state"] == "success"
    assert _xcoms(airflow_home, "gang_rank_1", GANG_XCOM_KEY) == []


def test_a_failed_gang_member_stops_node_0s_command_and_fails_it_as_a_retryable_failure(airflow_home, tmp_path):
    """Not a reschedule and not a failure without retry: the task's retries apply, the next try
    starts the whole gang again (here the command succeeds on it)."""
    command = "if [ -e MARKER ]; then exit 0; fi; touch MARKER; trap 'echo stopping; exit 143' TERM; sleep 120 & wait"
    gang = {"gpus": 4, "nodes": 2, "grace_period": 30, "retries": 1, "retry_delay": 0}
    run, preempt = _started_bash_task(
        airflow_home, tmp_path, "gang_member_failed", command, supervise=False, environ=GANG_NODE_0.to_env(), **gang
    )
    message = "node 1 of 2 on host gpu-b exited with code 1"
    write_notice(preempt, PreemptionNotice(GANG_NODE_FAILED, None, time.time() + 30, message=message))
    result = run.wait()
    assert [(a["state"], a["try_number"]) for a in result["attempts"]] == [("up_for_retry", 1), ("success", 2)]
    assert result["reschedules"]["job"] == 0
    output = run.output()
    assert "stopping" in output  # the command was asked to stop before the task failed
    assert f"Another node of the gang failed; failing: {message}" in output
    assert "goes back to its quota's queue" not in output
    assert not preempt.exists() and Path(f"{preempt}.handled").exists()
