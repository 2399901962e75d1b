"""A DAG of the gang-start test (tests/fleet/test_gang.py): a gang of two 1-GPU nodes whose command
only sleeps. The test keeps its member from starting (the member's host does not consume its Celery
queue); node 0 runs until the executor ends the gang. One retry, so that a retry used would show."""

from __future__ import annotations

import pendulum

from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

with DAG("gang_start_fails", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    QuotaTrainingOperator(task_id="stuck", quota="team-a", gpus=1, nodes=2, retries=1, command="sleep 600")
