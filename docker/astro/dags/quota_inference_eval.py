"""Evaluation shards on the reserved ``inference`` quota, written with ``@task.quota``.

The ``inference`` quota never lends and never borrows, so these tasks neither take GPUs from
the training teams nor lose theirs to them. Within the quota, a higher-priority shard preempts a
lower one: this DAG's shards run at priority 30; trigger it twice with ``priority_boost`` set to
see a within-quota preemption. A preempted shard gets :class:`QuotaPreempted` raised inside the
callable; its ``finally`` block saves how far it got, and the next run continues from there.
"""

from __future__ import annotations

import json

import pendulum

from airflow.sdk import DAG, Param, task

with DAG(
    dag_id="quota_inference_eval",
    description="Evaluation shards on the reserved inference quota (@task.quota, resumable)",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    doc_md=__doc__,
    tags=["quota", "inference", "example"],
    params={
        "batches": Param(200, type="integer", minimum=1, description="batches per shard"),
        "batch_sleep": Param(0.05, type="number", minimum=0, description="seconds per batch, to watch it"),
    },
) as dag:

    @task.quota(quota="inference", gpus=1, priority=30, grace_period=20, max_preemptions=10)
    def evaluate(shard: int, params=None, quota=None) -> dict:
        """Score ``params.batches`` synthetic batches; progress survives preemption via the checkpoint."""
        import time

        import torch

        batches, batch_sleep = int(params["batches"]), float(params["batch_sleep"])
        state = {"batch": 0, "sum_sq_error": 0.0}
        if quota.resume_from:
            state = json.loads(quota.resume_from.read_text())
            print(f"shard {shard}: resuming at batch {state['batch']} from {quota.resume_from}")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(shard)
        model = torch.nn.Linear(16, 1).to(device)

        def save():
            tmp = quota.checkpoint_dir / ".progress.json.tmp"
            tmp.write_text(json.dumps(state))
            tmp.replace(quota.checkpoint_dir / f"progress-{state['batch']:06d}.json")

        try:
            while state["batch"] < batches:
                g = torch.Generator().manual_seed(shard * 100_000 + state["batch"])
                x = torch.randn(64, 16, generator=g).to(device)
                with torch.no_grad():
                    err = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean().item()
                state["sum_sq_error"] += err
                state["batch"] += 1
                if state["batch"] % 20 == 0:
                    save()
                time.sleep(batch_sleep)
        finally:  # also on QuotaPreempted: keep what was scored
            save()
        return {"shard": shard, "mse": state["sum_sq_error"] / batches, "resumed": bool(quota.resume_from)}

    evaluate.expand(shard=[0, 1, 2, 3])
