"""The example DAGs in dags/ import cleanly in a real DagBag and describe quota tasks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.operators.quota_airflow import REPO, make_airflow_home  # first: keeps Airflow off ~/airflow
from airflow_quota_provider.policy import load_quota_file

DAGBAG_SCRIPT = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
tasks = {
    dag_id: [
        {"task_id": t.task_id, "pool": t.pool, "pool_slots": t.pool_slots, "priority_weight": t.priority_weight,
         "weight_rule": str(t.weight_rule), "executor": t.executor, "executor_config": t.executor_config,
         "operator": type(t).__name__, "command": getattr(t, "command", None)}
        for t in dag.tasks
    ]
    for dag_id, dag in bag.dags.items()
}
docs = {dag_id: {"tags": sorted(dag.tags), "description": dag.description, "doc_md": dag.doc_md}
        for dag_id, dag in bag.dags.items()}
print(json.dumps({"import_errors": bag.import_errors, "tasks": tasks, "docs": docs}))
"""


@pytest.fixture(scope="module")
def dagbag(tmp_path_factory):
    home = make_airflow_home(tmp_path_factory.mktemp("quota-dags-home"), migrate=False)  # parsing needs no DB
    proc = subprocess.run(
        [sys.executable, "-c", DAGBAG_SCRIPT, str(REPO / "dags")],
        env=home.env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


QUOTA_DAGS = {"quota_team_b_sweep", "quota_team_a_finetune", "quota_team_a_pretrain", "quota_inference_eval"}


def test_every_dag_file_in_dags_imports_without_errors(dagbag):
    assert dagbag["import_errors"] == {}
    assert QUOTA_DAGS <= set(dagbag["tasks"])


def test_the_aws_batch_examples_say_in_the_dag_list_and_their_docs_that_they_need_aws(dagbag):
    """The local demo loads dags/ with nothing on AWS to talk to: a user sees why before triggering."""
    aws = {dag_id for dag_id, doc in dagbag["docs"].items() if "aws-batch" in doc["tags"]}
    assert aws == {"aws_batch_training", "aws_batch_set_priority"}
    for dag_id in aws:
        doc = dagbag["docs"][dag_id]
        assert doc["description"].startswith("Needs AWS:"), dag_id
        assert "**Needs an AWS account.**" in doc["doc_md"] and "aws_default" in doc["doc_md"], dag_id


def test_example_tasks_are_quota_tasks_on_quotas_of_the_example_quota_file(dagbag):
    quotas = {q.name: q for q in load_quota_file(REPO / "examples" / "quotas.yaml").queues[0].quotas}
    tasks = [t for dag_id in QUOTA_DAGS for t in dagbag["tasks"][dag_id]]
    assert len(tasks) == 9
    for t in tasks:
        assert t["pool"] in quotas, t
        assert t["pool_slots"] <= quotas[t["pool"]].capacity, t
        assert (t["executor"], t["weight_rule"]) == ("quota", "absolute"), t
        gang = {"gpus", "nodes"} if t["executor_config"]["quota"].get("nodes") else set()
        assert set(t["executor_config"]["quota"]) == {"preemptible", "max_preemptions", "grace_period_s", *gang}, t


def test_example_story_borrows_then_reclaims(dagbag):
    """The sweep asks for more than team-b owns (it must borrow); the fine-tune fits within team-a and
    outranks the sweep (it may reclaim)."""
    quotas = {q.name: q for q in load_quota_file(REPO / "examples" / "quotas.yaml").queues[0].quotas}
    sweep = dagbag["tasks"]["quota_team_b_sweep"]
    finetune = dagbag["tasks"]["quota_team_a_finetune"][0]
    assert sum(t["pool_slots"] for t in sweep) > quotas["team-b"].capacity
    assert finetune["pool"] == "team-a" and finetune["pool_slots"] <= quotas["team-a"].capacity
    assert finetune["priority_weight"] > max(t["priority_weight"] for t in sweep)
    assert finetune["executor_config"]["quota"]["preemptible"] is False


def test_pretrain_example_is_a_gang_of_team_a_that_the_finetune_may_preempt(dagbag):
    """2 nodes of 2 GPUs, counted 4 against team-a (its whole capacity); between the sweep and the
    fine-tune in priority, so it reclaims from the sweep and the fine-tune preempts it; every node
    runs torchrun with the gang's variables, which bash expands on each node."""
    quotas = {q.name: q for q in load_quota_file(REPO / "examples" / "quotas.yaml").queues[0].quotas}
    (pretrain,) = dagbag["tasks"]["quota_team_a_pretrain"]
    assert {k: pretrain["executor_config"]["quota"][k] for k in ("gpus", "nodes")} == {"gpus": 2, "nodes": 2}
    assert pretrain["pool"] == "team-a" and pretrain["pool_slots"] == 4 == quotas["team-a"].capacity
    sweep = max(t["priority_weight"] for t in dagbag["tasks"]["quota_team_b_sweep"])
    finetune = dagbag["tasks"]["quota_team_a_finetune"][0]["priority_weight"]
    assert sweep < pretrain["priority_weight"] < finetune
    assert pretrain["executor_config"]["quota"]["preemptible"] is True
    command = pretrain["command"]
    assert " -m torch.distributed.run --nnodes=$QUOTA_NNODES --nproc-per-node=1 --node-rank=$QUOTA_NODE_RANK" \
        " --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT " in command
    assert command.split(" --master-port=$MASTER_PORT ")[1].startswith(str(REPO / "dags" / "scripts" / "train_mlp.py"))


def test_inference_example_runs_its_mapped_shards_with_a_checkpoint_dir_each(tmp_path_factory):
    """A real run of the @task.quota example (fewer batches): four mapped shards, each unmapped into
    a quota task with its own checkpoint directory."""
    home = make_airflow_home(tmp_path_factory.mktemp("quota-example-run-home"))
    source = (REPO / "dags" / "quota_inference_eval.py").read_text()
    home.write_dag("quota_inference_eval", source)
    run = home.start_dag_test(
        "quota_inference_eval",
        {"DAG_TEST_RUN_CONF": json.dumps({"batches": 30, "batch_sleep": 0})},
        supervise=False,  # in the driver process: torch is imported once, not once per shard
    )
    result = run.wait()
    assert result["dag_run_state"] == "success", run.output()[-4000:]
    assert {k: v["state"] for k, v in result["final"].items()} == {f"evaluate[{i}]": "success" for i in range(4)}
    shard_dirs = sorted((home.root / "quota" / "checkpoints" / "quota_inference_eval").glob("*/evaluate/*"))
    assert [d.name for d in shard_dirs] == ["0", "1", "2", "3"]
    for d in shard_dirs:
        assert json.loads(sorted(d.glob("attempt-*/progress-*.json"))[-1].read_text())["batch"] == 30
