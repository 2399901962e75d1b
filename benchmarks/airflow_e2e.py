"""End to end through a real Airflow 3.3: N one-second tasks in 4 quotas, QuotaExecutor vs LocalExecutor.

Both runs use the same DAG on the same machine, one after the other, each in its own temporary
AIRFLOW_HOME on SQLite (scheduler, dag-processor and api-server, as in production). Both executors
may run ``--slots`` tasks at once: QuotaExecutor through its quota file (4 quotas sharing ``--slots``
virtual GPUs, one per task), LocalExecutor through ``[core] parallelism``. The wall time of each run
is its DAG run's end_date - start_date; the ratio QuotaExecutor / LocalExecutor is printed last
(goal: at most 1.1).

usage: python benchmarks/airflow_e2e.py [--tasks 200] [--slots 8] [--keep]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.integration_support import LOCAL_EXECUTOR, QUOTA_EXECUTOR, AirflowInstance, free_port  # noqa: E402

QUOTAS = 4

DAG = '''
import time
import pendulum
from airflow.sdk import DAG, task

with DAG("bench_e2e", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False,
         max_active_tasks={tasks}):
    for i in range({tasks}):
        @task(task_id=f"t{{i:03d}}", pool=f"bench-{{i % {quotas}}}", pool_slots=1)
        def one_second():
            time.sleep(1)
        one_second()
'''


def quota_file(slots: int) -> str:
    per = slots // QUOTAS
    lines = ["queues:", "  - name: bench", f"    capacity: {per * QUOTAS}", "    quotas:"]
    lines += [f"      - {{name: bench-{q}, capacity: {per}}}" for q in range(QUOTAS)]
    return "\n".join(lines) + "\n"


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace(" ", "T")).timestamp()


def run_once(root: Path, name: str, executor: str, port: int, tasks: int, slots: int) -> float:
    dags = root / f"{name}-dags"
    dags.mkdir(parents=True)
    (dags / "bench_e2e.py").write_text(textwrap.dedent(DAG.format(tasks=tasks, quotas=QUOTAS)))
    parallelism = str(max(256, tasks)) if executor == QUOTA_EXECUTOR else str(slots)
    instance = AirflowInstance(
        root / name,
        port=port,
        quota_file=quota_file(slots),
        dags_folder=dags,
        executor=executor,
        extra_env={
            "AIRFLOW__QUOTA__VIRTUAL_GPUS": str(slots),
            "AIRFLOW__CORE__PARALLELISM": parallelism,
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(tasks),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "3600",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        },
    )
    try:
        instance.start()
        if executor != QUOTA_EXECUTOR:  # the same pools, unlimited: only the executor gates
            for q in range(QUOTAS):
                instance.airflow("pools", "set", f"bench-{q}", "-1", "benchmark pool")
        run_id = instance.trigger("bench_e2e")
        state = instance.wait_run("bench_e2e", run_id, timeout=3600)
        row = instance.sql(
            "SELECT start_date, end_date FROM dag_run WHERE dag_id='bench_e2e' AND run_id=?", run_id
        )[0]
        done = instance.sql(
            "SELECT count(*) AS n FROM task_instance WHERE dag_id='bench_e2e' AND state='success'"
        )[0]["n"]
        if state != "success" or done != tasks:
            raise SystemExit(f"Error: {name}: run {state}, {done}/{tasks} tasks succeeded")
        return _ts(row["end_date"]) - _ts(row["start_date"])
    finally:
        instance.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--slots", type=int, default=8, help="tasks at once (a multiple of 4)")
    parser.add_argument("--keep", action="store_true", help="keep the AIRFLOW_HOMEs")
    args = parser.parse_args(argv)
    if args.slots < QUOTAS or args.slots % QUOTAS:
        raise SystemExit(f"Error: --slots: {args.slots} is not a positive multiple of {QUOTAS}")
    root = Path(tempfile.mkdtemp(prefix="quota-bench-"))
    started = time.monotonic()
    try:
        quota = run_once(root, "quota", QUOTA_EXECUTOR, free_port(18000, 18009, also=50), args.tasks, args.slots)
        print(f"QuotaExecutor: {args.tasks} one-second tasks in {QUOTAS} quotas, {args.slots} at once: {quota:.1f} s")
        local = run_once(root, "local", LOCAL_EXECUTOR, free_port(18000, 18009, also=50), args.tasks, args.slots)
        print(f"LocalExecutor: {args.tasks} one-second tasks, parallelism {args.slots}: {local:.1f} s")
        print(f"ratio QuotaExecutor/LocalExecutor: {quota / local:.3f} (goal <= 1.1)")
        print(f"(benchmark wall time {time.monotonic() - started:.0f} s, homes under {root})")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
