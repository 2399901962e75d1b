"""Team B's hyperparameter sweep: more GPUs than team B owns, so it borrows team A's idle ones.

Part one of the borrow-then-reclaim story (with ``examples/quotas.yaml``: an 8-GPU fleet, team-a
owns 4, team-b 2, inference 2 reserved):

1. Trigger this DAG. Six trials of 1 GPU each ask for 6 GPUs at priority 10. Team-b owns 2, so
   2 trials run on its own GPUs and 4 run on GPUs *borrowed* from team-a, which is idle.
   ``airflow quota status`` shows team-b using 6 GPUs of its 2, 4 of them borrowed.
2. Trigger ``quota_team_a_finetune``: team-a wants 2 of its GPUs back. The executor preempts two
   of team-b's borrowing trials (reclaim): each gets SIGTERM, writes a checkpoint within its grace
   period and goes to *up_for_reschedule* (grid view: light blue), not *failed*; its try number
   stays 1. The light blue lasts about a second: Airflow queues the task again at once, so it shows
   *queued* while it waits for GPUs again.
3. When team-a's job ends, the preempted trials start again, print ``resume from ...ckpt-N.pt`` in
   their log and continue from step N.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pendulum

from airflow.sdk import DAG, Param

from airflow_quota_provider.operators.training import QuotaTrainingOperator

TRAIN_SCRIPT = Path(__file__).resolve().parent / "scripts" / "train_mlp.py"

with DAG(
    dag_id="quota_team_b_sweep",
    description="Team B sweep: borrows idle GPUs of team A, gets reclaimed, resumes from checkpoints",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    tags=["quota", "team-b", "example"],
    params={
        "steps": Param(3000, type="integer", minimum=1, description="training steps per trial"),
        "step_sleep": Param(0.05, type="number", minimum=0, description="seconds per step, to watch it"),
    },
) as dag:
    for trial, lr in enumerate(["3e-4", "1e-3", "3e-3", "1e-2", "3e-2", "1e-1"]):
        QuotaTrainingOperator(
            task_id=f"trial_{trial}",
            quota="team-b",
            gpus=1,
            priority=10,
            command=(
                f"{sys.executable} {TRAIN_SCRIPT} --lr {lr} --seed {trial}"
                " --steps {{ params.steps }} --step-sleep {{ params.step_sleep }} --checkpoint-every 100"
            ),
            grace_period=30,
            max_preemptions=5,
        )
