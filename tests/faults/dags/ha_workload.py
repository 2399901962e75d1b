"""The fault suite's workload: ``QUOTA_HA_TASKS`` tasks over four quotas with mixed priorities and
sizes. ``ha_low`` fills the fleet (borrowing); ``ha_high`` comes later at higher priorities and takes
GPUs back by reclaim and within-quota preemption. Tasks sleep; a preempted one is stopped by Airflow
(up_for_reschedule) and runs again on the same try. ``skew_low``/``skew_high``: the clock-skew case."""

from __future__ import annotations

import os
import time

import pendulum

from airflow.sdk import DAG, task

START = pendulum.datetime(2026, 1, 1, tz="UTC")
TASKS = int(os.environ.get("QUOTA_HA_TASKS", "100"))
QUOTAS = ("q0", "q1", "q2", "q3")
HIGH = TASKS // 5


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def gpu_task(task_id: str, quota: str, *, gpus: int, priority: int, seconds: float, preemptible: bool = True):
    return task(
        task_id=task_id, pool=quota, pool_slots=gpus, priority_weight=priority, weight_rule="absolute", retries=0,
        executor_config={"quota": {"preemptible": preemptible}},
    )(_sleep)(seconds)


with DAG("ha_low", schedule=None, start_date=START, catchup=False, max_active_tasks=TASKS):
    for i in range(TASKS - HIGH):
        gpu_task(f"low_{i:03d}", QUOTAS[i % 4], gpus=1 + (i % 3 == 0), priority=1 + i % 5, seconds=2 + i % 3)

with DAG("ha_high", schedule=None, start_date=START, catchup=False, max_active_tasks=TASKS):
    for i in range(HIGH):
        gpu_task(f"high_{i:03d}", QUOTAS[(i * 3) % 4], gpus=1 + (i % 2), priority=100 + i % 7, seconds=2)

# One long task per quota that nothing preempts: still running when a scheduler killed while it holds
# one is declared dead (after scheduler_health_check_threshold), so that there is something to adopt.
with DAG("ha_anchor", schedule=None, start_date=START, catchup=False):
    for i, quota in enumerate(QUOTAS):
        gpu_task(f"anchor_{i}", quota, gpus=1, priority=1000, seconds=90, preemptible=False)

# A scheduler whose clock runs 30 s ahead admits these (q0 fills the fleet, borrowing 9 GPUs); the
# other scheduler must reclaim a host from one of them at once for q1's ``urgent``.
with DAG("skew_low", schedule=None, start_date=START, catchup=False):
    for i in range(3):
        gpu_task(f"skewed_{i}", "q0", gpus=4, priority=1, seconds=120)

with DAG("skew_high", schedule=None, start_date=START, catchup=False):
    gpu_task("urgent", "q1", gpus=3, priority=500, seconds=1)
