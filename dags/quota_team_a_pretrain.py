"""Team A's pretraining on a gang: 2 nodes of 2 GPUs each, started, stopped and resumed as one job.

``nodes=2`` makes the task a gang: the executor admits it only when it can hold 2 GPUs on each of
2 hosts at once (all or nothing: it never starts on one node and waits for the other), and counts
``gpus`` x ``nodes`` = 4 GPUs against team-a's quota, its whole capacity. Node 0 is the Airflow
task; the executor starts node 1 with the same rendered command. On ``./scripts/run``'s local
launcher both nodes run on this machine, each on GPUs of its own, with ``MASTER_ADDR=127.0.0.1``
and a ``MASTER_PORT`` chosen at launch.

Each node runs torchrun with one process (``--nproc-per-node=1``): the GPUs are virtual here, so
``train_mlp.py`` trains data-parallel on the CPU (torch.distributed with gloo, DDP), each rank on
its own half of every batch. No ``GLOO_SOCKET_IFNAME`` is needed on one machine: gloo binds the
address of the host's name, which this machine reaches, or falls back to loopback. On hosts whose
name resolves to a loopback address (Debian's ``127.0.1.1``), set ``env={"GLOO_SOCKET_IFNAME":
"<the interface between the hosts>"}``.

A preemption stops the gang as one: both nodes get SIGTERM, every rank stops after the same step
(each step all-reduces a stop flag), rank 0 checkpoints it, and when the gang runs again both
nodes resume from that checkpoint (``$QUOTA_RESUME_FROM``). A failed node fails the task, naming
the node and its host; Airflow may retry it.

With the borrow-then-reclaim story (``examples/quotas.yaml``):

1. Trigger ``quota_team_b_sweep``: team B borrows team A's 4 idle GPUs.
2. Trigger this DAG: it needs all 4 of team A's GPUs at once, so team A reclaims all four (four
   trials get SIGTERM) and the gang starts only once they have stopped.
3. Trigger ``quota_team_a_finetune`` (priority 80): no GPU is idle (team B runs on its own 2,
   inference's 2 are reserved), so it preempts this gang (priority 60) within team A. Both nodes
   stop after the same step, rank 0 checkpointing it; the gang waits for 4 free GPUs of team A
   (the fine-tune's end) and then resumes on both nodes from that step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum

from airflow.sdk import DAG, Param

from airflow_quota_provider.operators.training import QuotaTrainingOperator

TRAIN_SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_mlp.py"

with DAG(
    dag_id="quota_team_a_pretrain",
    description="Team A pretraining on 2 nodes x 2 GPUs: a gang, admitted, preempted and resumed as one job",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    tags=["quota", "team-a", "gang", "example"],
    params={
        "steps": Param(3000, type="integer", minimum=1, description="training steps"),
        "step_sleep": Param(0.05, type="number", minimum=0, description="seconds per step, to watch it"),
    },
) as dag:
    QuotaTrainingOperator(
        task_id="pretrain",
        quota="team-a",
        gpus=2,
        nodes=2,
        priority=60,
        # The gang's variables are the node's environment: bash expands them on every node.
        command=(
            f"{sys.executable} -m torch.distributed.run --nnodes=$QUOTA_NNODES --nproc-per-node=1"
            " --node-rank=$QUOTA_NODE_RANK --master-addr=$MASTER_ADDR --master-port=$MASTER_PORT"
            f" {TRAIN_SCRIPT} --hidden 256 --seed 7"
            " --steps {{ params.steps }} --step-sleep {{ params.step_sleep }} --checkpoint-every 100"
        ),
    )
