"""A DAG of the worker-death test: one long 2-GPU training command that has started a process of
its own in a session of its own (as a data loader or a launcher's workers may), so that a signal to
the command's process group, or the death of its parent, does not reach it."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pendulum

from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

STUB = Path(__file__).resolve().parents[2] / "executors" / "train_stub.py"

with DAG("worker_death", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    QuotaTrainingOperator(
        task_id="wd_train",
        quota="team-a",
        gpus=2,
        command=["bash", "-c", f"setsid sleep 100000 & exec {shlex.join([sys.executable, str(STUB), 'wd_train', '600', '0.5'])}"],
    )
