"""The scheduler-task contract: each case is named after the rule it checks."""

from __future__ import annotations

import json

import pytest

from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.protocol import (
    DEFAULT_GRACE_PERIOD_S,
    EXECUTOR_CONFIG_KEY,
    GANG_NODE_FAILED,
    GANG_VARIABLES,
    HANDLED_SUFFIX,
    GangCommand,
    GangEnvironment,
    GangEnvironmentError,
    PreemptionNotice,
    QuotaTaskConfig,
    QuotaTaskConfigError,
    TaskEnvironment,
    acknowledge_notice,
    read_notice,
    write_notice,
)


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(QuotaTaskConfig(), id="defaults survive the round trip"),
        pytest.param(
            QuotaTaskConfig(preemptible=False, max_preemptions=3, grace_period_s=30.0, expected_runtime_s=600.0),
            id="what the operators write survives the round trip",
        ),
        pytest.param(
            QuotaTaskConfig(quota="team-a", gpus=2, priority=50), id="hand-written quota, gpus and priority survive"
        ),
        pytest.param(QuotaTaskConfig(gpus=8, nodes=4), id="a gang's gpus per host and nodes survive"),
        pytest.param(QuotaTaskConfig(gpu_type=("h100",)), id="one GPU type survives"),
        pytest.param(QuotaTaskConfig(gpu_type=("h100", "a100")), id="GPU types in order of preference survive"),
    ],
)
def test_task_config_round_trip(config):
    assert QuotaTaskConfig.from_executor_config({EXECUTOR_CONFIG_KEY: config.to_dict()}) == config


def test_task_config_writes_optional_fields_only_when_set():
    assert QuotaTaskConfig(grace_period_s=30.0).to_dict() == {
        "preemptible": True,
        "max_preemptions": None,
        "grace_period_s": 30.0,
    }


def test_a_gpu_type_is_written_as_given_one_as_a_string_several_as_a_list():
    assert QuotaTaskConfig(gpu_type=("l4",)).to_dict()["gpu_type"] == "l4"
    assert QuotaTaskConfig(gpu_type=("h100", "a100")).to_dict()["gpu_type"] == ["h100", "a100"]
    assert QuotaTaskConfig.from_executor_config({EXECUTOR_CONFIG_KEY: {"gpu_type": "l4"}}).gpu_type == ("l4",)


@pytest.mark.parametrize(
    ("executor_config", "expected"),
    [
        pytest.param(None, QuotaTaskConfig(), id="no executor_config: no settings"),
        pytest.param(["quota"], QuotaTaskConfig(), id="executor_config not a dict: no settings"),
        pytest.param({EXECUTOR_CONFIG_KEY: "team-a"}, QuotaTaskConfig(), id="settings not a dict: none"),
        pytest.param({EXECUTOR_CONFIG_KEY: {"quota": ""}}, QuotaTaskConfig(), id="empty quota: none"),
        *(
            pytest.param(
                {EXECUTOR_CONFIG_KEY: {"expected_runtime_s": value}}, QuotaTaskConfig(),
                id=f"expected runtime {value!r:.12}: unknown",
            )
            for value in ("1h", -5, 0, True, float("inf"), float("nan"), 10**400)
        ),
        pytest.param(
            {EXECUTOR_CONFIG_KEY: {"gpus": "2", "nodes": "3", "priority": "7", "grace_period_s": "30"}},
            QuotaTaskConfig(gpus=2, nodes=3, priority=7, grace_period_s=30.0),
            id="numbers written as strings are read as numbers",
        ),
    ],
)
def test_task_config_tolerates_hand_written_junk(executor_config, expected):
    assert QuotaTaskConfig.from_executor_config(executor_config) == expected


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        pytest.param("gpus", 2.0, 2, id="a whole float is an integer"),
        pytest.param("priority", 0, 0, id="priority 0 is allowed"),
        pytest.param("max_preemptions", 0, 0, id="max_preemptions 0 is allowed"),
        pytest.param("gpus", 2097151, 2097151, id="the most gpus a gang of 1024 hosts fits the column with"),
        pytest.param("grace_period_s", 0.5, 0.5, id="half a second of grace"),
        pytest.param("preemptible", "false", False, id="preemptible false as a string is false"),
        pytest.param("preemptible", " True ", True, id="preemptible true as a string is true"),
    ],
)
def test_task_config_reads_every_value_in_range(field, value, expected):
    assert getattr(QuotaTaskConfig.from_executor_config({EXECUTOR_CONFIG_KEY: {field: value}}), field) == expected


GPUS = "an integer from 1 to 2097151"
NODES = "an integer from 1 to 1024"
INT32 = "an integer from 0 to 2147483647"
SECONDS = "a finite number of seconds > 0, at most 86400"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        pytest.param("gpus", "four", f"'four' is not {GPUS}", id="gpus in words"),
        pytest.param("gpus", 0, f"0 is not {GPUS}", id="no gpus"),
        pytest.param("gpus", -1, f"-1 is not {GPUS}", id="negative gpus"),
        pytest.param("gpus", 2.5, f"2.5 is not {GPUS}", id="a fraction of a gpu"),
        pytest.param("gpus", True, f"True is not {GPUS}", id="a bool is no gpu count"),
        pytest.param("gpus", 2097152, f"2097152 is not {GPUS}", id="gpus a gang's total overflows the column with"),
        pytest.param("gpus", float("nan"), f"nan is not {GPUS}", id="NaN gpus"),
        pytest.param("nodes", [1], f"[1] is not {NODES}", id="nodes in a list"),
        pytest.param("nodes", 0, f"0 is not {NODES}", id="no nodes"),
        pytest.param("nodes", 1025, f"1025 is not {NODES}", id="more nodes than a job may span"),
        pytest.param("nodes", float("inf"), f"inf is not {NODES}", id="infinite nodes"),
        pytest.param("priority", "x", f"'x' is not {INT32}", id="priority in words"),
        pytest.param("priority", -1, f"-1 is not {INT32}", id="negative priority"),
        pytest.param("priority", 2**31, f"2147483648 is not {INT32}", id="priority past the column"),
        pytest.param("priority", False, f"False is not {INT32}", id="a bool is no priority"),
        pytest.param("max_preemptions", -1, f"-1 is not {INT32}", id="negative max_preemptions"),
        pytest.param("max_preemptions", 2**63, f"9223372036854775808 is not {INT32}", id="huge max_preemptions"),
        pytest.param("max_preemptions", "1.5", f"'1.5' is not {INT32}", id="a fraction of a preemption in a string"),
        pytest.param("grace_period_s", "nan", f"'nan' is not {SECONDS}", id="NaN grace period as a string"),
        pytest.param("grace_period_s", float("inf"), f"inf is not {SECONDS}", id="infinite grace period"),
        pytest.param("grace_period_s", 0, f"0 is not {SECONDS}", id="no grace period"),
        pytest.param("grace_period_s", -30, f"-30 is not {SECONDS}", id="negative grace period"),
        pytest.param("grace_period_s", True, f"True is not {SECONDS}", id="a bool is no grace period"),
        pytest.param(
            "grace_period_s", 10**400, f"100000000000000000...0000000000000000000 is not {SECONDS}",
            id="a grace period past a float",
        ),
        pytest.param("grace_period_s", "soon", f"'soon' is not {SECONDS}", id="grace period in words"),
        pytest.param("grace_period_s", 1e12, f"1000000000000.0 is not {SECONDS}",
                     id="a grace period past a day would hold a victim's GPUs for good"),
        pytest.param("preemptible", "no", "'no' is not true or false", id="preemptible in other words"),
        pytest.param("preemptible", 0, "0 is not true or false", id="a number is no yes or no"),
        *(
            pytest.param(
                "gpu_type", value,
                f"{value!r} is not a GPU type name (letters, digits, '.', '-', '_', at most 64) or a non-empty list of distinct ones",
                id=f"gpu_type {why}",
            )
            for value, why in (
                ([], "an empty list"), ("", "empty"), (["h100", "h100"], "a type twice"), (8, "a number"),
                (["h100", 8], "a number in the list"), ("h100 sxm", "with a space"), ({"h100": 1}, "a mapping"),
            )
        ),
        pytest.param(
            "quota", "q" * 129, "'qqqqqqqqqqqq...qqqqqqqqqqqqq' is not a quota name of at most 128 characters",
            id="a quota name longer than the job table's",
        ),
    ],
)
def test_a_value_the_executor_cannot_use_is_an_error_naming_the_field(field, value, message):
    with pytest.raises(QuotaTaskConfigError) as err:
        QuotaTaskConfig.from_executor_config({EXECUTOR_CONFIG_KEY: {"gpus": 1, field: value}})
    assert err.value.field == field
    assert str(err.value).startswith(f'executor_config["quota"]["{field}"]: {message}')


def test_a_long_junk_value_is_shortened_in_the_message():
    """The message fails the task and is stored with its job."""
    with pytest.raises(QuotaTaskConfigError) as err:
        QuotaTaskConfig.from_executor_config({EXECUTOR_CONFIG_KEY: {"gpus": "9" * 10_000}})
    assert len(str(err.value)) < 120


def test_environment_round_trip(tmp_path):
    env = TaskEnvironment(
        cuda_visible_devices="0,3",
        job_id="17",
        host="gpu-1",
        quota="team-a",
        preemption_count=2,
        grace_period_s=45.0,
        gpu_type="h100",
        preempt_file=tmp_path / "preempt.json",
    )
    assert TaskEnvironment.read(env.to_env()) == env
    assert env.to_env()["QUOTA_GPU_TYPE"] == "h100"


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        pytest.param({}, TaskEnvironment(), id="without the executor: defaults"),
        pytest.param({"QUOTA_GRACE_PERIOD_S": "soon"}, TaskEnvironment(), id="grace period not a number: unset"),
        pytest.param({"QUOTA_GRACE_PERIOD_S": "-1"}, TaskEnvironment(), id="grace period not > 0: unset"),
        pytest.param({"QUOTA_PREEMPTION_COUNT": "x"}, TaskEnvironment(), id="preemption count not a number: 0"),
        pytest.param({"QUOTA_PREEMPT_FILE": ""}, TaskEnvironment(), id="empty preempt file: none"),
        pytest.param({"QUOTA_GPU_TYPE": ""}, TaskEnvironment(), id="empty GPU type: an untyped job queue"),
    ],
)
def test_environment_read_tolerates_junk(environ, expected):
    assert TaskEnvironment.read(environ) == expected


GANG = GangEnvironment(
    nnodes=4, node_rank=1, nproc_per_node=8, master_addr="10.0.3.7", master_port=29500, rdzv_id="17"
)


def test_gang_environment_round_trip():
    assert GangEnvironment.read(GANG.to_env()) == GANG


def test_gang_environment_gives_torchrun_every_variable():
    assert GANG.to_env() == {
        "QUOTA_NNODES": "4",
        "QUOTA_NODE_RANK": "1",
        "QUOTA_NPROC_PER_NODE": "8",
        "MASTER_ADDR": "10.0.3.7",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "32",  # training processes of the whole gang: nodes x processes per node
        "QUOTA_RDZV_ID": "17",
        "QUOTA_RDZV_ENDPOINT": "10.0.3.7:29500",
    }
    assert tuple(GANG.to_env()) == GANG_VARIABLES


@pytest.mark.parametrize(
    "environ",
    [
        pytest.param({}, id="no variables"),
        pytest.param({"QUOTA_NNODES": ""}, id="empty node count"),
        pytest.param(
            {"MASTER_ADDR": "10.0.3.7", "MASTER_PORT": "29500", "WORLD_SIZE": "8"},
            id="torch's own variables alone",
        ),
    ],
)
def test_without_a_node_count_a_job_is_on_one_host(environ):
    assert GangEnvironment.read(environ) is None


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        pytest.param(
            {"nnodes": 1, "node_rank": 0}, "nnodes", "nnodes (QUOTA_NNODES): 1 is not an integer from 2 to 1024",
            id="a job on one host is no gang",
        ),
        pytest.param(
            {"nnodes": 1025}, "nnodes", "nnodes (QUOTA_NNODES): 1025 is not an integer from 2 to 1024",
            id="more nodes than a job may span",
        ),
        pytest.param(
            {"node_rank": 4}, "node_rank", "node_rank (QUOTA_NODE_RANK): 4 is not an integer from 0 to 3 (nnodes is 4)",
            id="rank past the gang",
        ),
        pytest.param(
            {"node_rank": -1}, "node_rank", "node_rank (QUOTA_NODE_RANK): -1 is not an integer from 0 to 3",
            id="negative rank",
        ),
        pytest.param(
            {"nproc_per_node": 0}, "nproc_per_node", "nproc_per_node (QUOTA_NPROC_PER_NODE): 0 is not an integer >= 1",
            id="no process per node",
        ),
        pytest.param(
            {"master_port": 0}, "master_port", "master_port (MASTER_PORT): 0 is not an integer from 1 to 65535",
            id="port 0",
        ),
        pytest.param(
            {"master_port": 65536},
            "master_port",
            "master_port (MASTER_PORT): 65536 is not an integer from 1 to 65535",
            id="port past 65535",
        ),
        pytest.param(
            {"master_port": True}, "master_port", "master_port (MASTER_PORT): True is not an integer", id="boolean port"
        ),
        pytest.param(
            {"master_addr": ""},
            "master_addr",
            "master_addr (MASTER_ADDR): '' is not a non-empty string without whitespace",
            id="empty master address",
        ),
        pytest.param(
            {"master_addr": "gpu 1"}, "master_addr", "master_addr (MASTER_ADDR): 'gpu 1' is not a non-empty string",
            id="master address with a space",
        ),
        pytest.param(
            {"rdzv_id": ""}, "rdzv_id", "rdzv_id (QUOTA_RDZV_ID): '' is not a non-empty string",
            id="empty rendezvous id",
        ),
    ],
)
def test_bad_gang_environment_error_names_the_field_and_its_variable(changes, field, message):
    with pytest.raises(GangEnvironmentError) as err:
        GangEnvironment(**{**GANG.__dict__, **changes})
    assert err.value.field == field
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"QUOTA_NODE_RANK": None},
            "node_rank (QUOTA_NODE_RANK): is not set, but QUOTA_NNODES is",
            id="a node without its rank",
        ),
        pytest.param(
            {"MASTER_PORT": ""}, "master_port (MASTER_PORT): is not set, but QUOTA_NNODES is", id="empty master port"
        ),
        pytest.param(
            {"QUOTA_NPROC_PER_NODE": "eight"},
            "nproc_per_node (QUOTA_NPROC_PER_NODE): 'eight' is not an integer",
            id="processes per node not a number",
        ),
        pytest.param(
            {"QUOTA_NODE_RANK": "4"},
            "node_rank (QUOTA_NODE_RANK): 4 is not an integer from 0 to 3",
            id="rank past the gang",
        ),
    ],
)
def test_a_gang_node_with_missing_or_bad_variables_is_an_error_not_a_single_host_job(changes, message):
    environ = {k: v for k, v in {**GANG.to_env(), **changes}.items() if v is not None}
    with pytest.raises(GangEnvironmentError) as err:
        GangEnvironment.read(environ)
    assert str(err.value).startswith(message)


def test_default_grace_period_is_the_quota_files():
    assert DEFAULT_GRACE_PERIOD_S == Quota("q", 1).grace_period_s == 120.0


@pytest.mark.parametrize(
    "notice",
    [
        pytest.param(PreemptionNotice("reclaim", "j9", 1000.5), id="a preemption survives write and read"),
        pytest.param(
            PreemptionNotice("reclaim", "j9", 1000.5, fail=True, message="max_preemptions is 2"),
            id="a failing preemption keeps its message",
        ),
        pytest.param(
            PreemptionNotice(GANG_NODE_FAILED, None, 1000.5, message="node 1 of 2 on host gpu-b exited with code 1"),
            id="a failed gang member's notice keeps its message without failing outright",
        ),
    ],
)
def test_notice_write_read(tmp_path, notice):
    path = tmp_path / "jobs" / "1" / "preempt.json"
    write_notice(path, notice)
    assert read_notice(path) == notice
    assert [p.name for p in path.parent.iterdir()] == ["preempt.json"]  # no temporary file left


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param(
            json.dumps({"reason": "within_quota", "deadline": "1970-01-01T00:16:40+00:00"}),
            PreemptionNotice("within_quota", None, 1000.0),
            id="an ISO deadline is read as epoch seconds",
        ),
        pytest.param('{"reason": "rec', PreemptionNotice("preempted", None, None), id="half a file still counts"),
        pytest.param("[1, 2]", PreemptionNotice("preempted", None, None), id="a file that is no object still counts"),
        pytest.param(
            json.dumps({"reason": "reclaim", "fail": "yes"}),
            PreemptionNotice("reclaim", None, None),
            id="fail only when it is true",
        ),
    ],
)
def test_notice_read_tolerates_partial_files(tmp_path, text, expected):
    path = tmp_path / "preempt.json"
    path.write_text(text)
    assert read_notice(path) == expected


def test_no_file_is_no_notice(tmp_path):
    assert read_notice(tmp_path / "preempt.json") is None


def test_acknowledged_notice_is_renamed_and_no_longer_read(tmp_path):
    path = tmp_path / "preempt.json"
    write_notice(path, PreemptionNotice("reclaim", "j9", None))
    acknowledge_notice(path)
    acknowledge_notice(path)  # twice: nothing there any more, no error
    assert read_notice(path) is None
    assert (tmp_path / f"preempt.json{HANDLED_SUFFIX}").exists()


def test_gang_command_survives_a_json_round_trip():
    command = GangCommand(argv=["torchrun", "train.py"], env={"QUOTA_RESUME_FROM": ""}, cwd=None)
    assert GangCommand.from_dict(json.loads(json.dumps(command.to_dict()))) == command


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"argv": []}, "argv: [] is not a non-empty list of strings", id="empty argv"),
        pytest.param({"argv": "torchrun x.py"}, "argv: 'torchrun x.py' is not a non-empty list", id="argv a string"),
        pytest.param({"argv": ["torchrun", 3]}, "argv: ['torchrun', 3] is not a non-empty", id="argv not all strings"),
        pytest.param({"argv": None}, "argv: None is not", id="no argv"),
        pytest.param({"env": {"N": 3}}, "env: {'N': 3} is not a dict of strings to strings", id="env value a number"),
        pytest.param({"env": ["A=1"]}, "env: ['A=1'] is not a dict", id="env a list"),
        pytest.param({"cwd": 7}, "cwd: 7 is not a path string or None", id="cwd a number"),
    ],
)
def test_a_malformed_gang_command_is_refused_naming_the_field(changes, message):
    data = {"argv": ["torchrun", "train.py"], "env": {}, "cwd": "/work", **changes}
    with pytest.raises(ValueError) as err:
        GangCommand.from_dict(data)
    assert str(err.value).startswith(message)


def test_a_gang_command_that_is_no_object_is_refused_naming_the_xcom():
    with pytest.raises(ValueError, match=r"^quota_gang: \['torchrun'\] is not an object with argv, env and cwd"):
        GangCommand.from_dict(["torchrun"])
