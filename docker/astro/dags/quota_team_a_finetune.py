"""Team A's fine-tune at high priority: takes back the GPUs team A lent to team B.

Part two of the borrow-then-reclaim story (see ``quota_team_b_sweep``). Trigger it while team B's
sweep is borrowing team A's GPUs. Team A asks for 2 GPUs at priority 80, within its own capacity
of 4, so it may *reclaim*: the executor preempts just enough of team B's borrowing trials, gives
each its grace period to checkpoint, and starts this job on the freed GPUs. ``airflow quota
explain quota_team_a_finetune <run_id> finetune`` says what it waits for meanwhile.

``preemptible=False``: nobody may take these GPUs while the fine-tune runs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum

from airflow.sdk import DAG, Param

from airflow_quota_provider.operators.training import QuotaTrainingOperator

TRAIN_SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_mlp.py"

with DAG(
    dag_id="quota_team_a_finetune",
    description="Team A fine-tune at priority 80: reclaims the GPUs team B borrowed",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    tags=["quota", "team-a", "example"],
    params={
        "steps": Param(1500, type="integer", minimum=1, description="training steps"),
        "step_sleep": Param(0.05, type="number", minimum=0, description="seconds per step, to watch it"),
    },
) as dag:
    QuotaTrainingOperator(
        task_id="finetune",
        quota="team-a",
        gpus=2,
        priority=80,
        command=(
            f"{sys.executable} {TRAIN_SCRIPT} --hidden 256 --seed 42"
            " --steps {{ params.steps }} --step-sleep {{ params.step_sleep }} --checkpoint-every 100"
        ),
        preemptible=False,
    )
