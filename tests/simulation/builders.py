"""Small hand-made workloads and quota files for the simulator's tests."""

from __future__ import annotations

from pathlib import Path

import yaml

from airflow_quota_provider.policy import parse_quota_file
from airflow_quota_provider.simulation.workload import TraceJob

HEADER = "job_id,team,submit_time_s,duration_s,gpus,priority,checkpoint_interval_s"


def job(job_id: str, team: str, submit: float, duration: float, gpus: int, priority: int = 0,
        checkpoint: float | None = None) -> TraceJob:
    return TraceJob(id=job_id, team=team, submit_time_s=submit, duration_s=duration, gpus=gpus, priority=priority,
                    checkpoint_interval_s=checkpoint)


def two_quotas(*, capacity: int = 8, each: int = 4, grace: float = 30.0, max_preemptions: int | None = None,
               **extra) -> dict:
    """Queue ``pool`` of ``capacity`` GPUs: quotas ``a`` and ``b``, ``each`` GPUs, lending and borrowing."""
    quota = {"capacity": each, "sharing": "lend_and_borrow", "grace_period_s": grace,
             "preemption": {"within_quota": "lower_priority", "reclaim": "any"}, **extra}
    return {"queues": [{"name": "pool", "capacity": capacity, "quotas": [
        {"name": "a", **quota},
        {"name": "b", **quota, "max_preemptions": max_preemptions},
    ]}]}


def quota_file(data: dict):
    return parse_quota_file(data)


def write_files(tmp_path: Path, jobs: list[TraceJob], config: dict) -> tuple[Path, Path]:
    trace = tmp_path / "trace.csv"
    lines = [HEADER]
    for j in jobs:
        lines.append(f"{j.id},{j.team},{j.submit_time_s:g},{j.duration_s:g},{j.gpus},"
                     f"{'' if j.priority is None else j.priority},"
                     f"{'' if j.checkpoint_interval_s is None else j.checkpoint_interval_s}")
    trace.write_text("\n".join(lines) + "\n")
    config_path = tmp_path / "quotas.yaml"
    config_path.write_text(yaml.safe_dump(config))
    return trace, config_path


# Borrow, then reclaim: b1 borrows a's 4 GPUs at t=0; a1 arrives at 250 within a's capacity and
# reclaims them. Grace 30 s: b1 stops at 280 having run 280 s, checkpoints every 100 s, so it keeps
# 200 s and loses 80 s x 8 GPUs = 640 GPU-s. a1 runs 280-380; b1 restarts at 380 with 800 s left.
RECLAIM_JOBS = [job("b1", "b", 0, 1000, 8), job("a1", "a", 250, 100, 4)]
