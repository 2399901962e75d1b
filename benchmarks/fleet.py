"""The GPU fleet, measured: end to end against CeleryExecutor, the executor cycle on PostgreSQL, and
how fast a preemption notice reaches a task on another host. Prints figures and ratios.

1. ``e2e``: N one-second tasks over 3 hosts of 4 virtual GPUs, through QuotaExecutor + Celery
   (``airflow quota worker`` hosts) and through plain CeleryExecutor with the same workers
   (``airflow celery worker``, 4 pool processes each), one after the other on PostgreSQL and Redis,
   both with ``[scheduler] scheduler_idle_sleep_time`` 0.25 s (the fleet setting of docs/fleet.md).
   Wall time = the DAG run's end_date - start_date. Goal: ratio at most 1.1.
2. ``cycle``: one ``QuotaExecutor.sync()`` with 10,000 waiting and 2,000 running jobs (250 hosts of
   8 GPUs, 20 quotas) on PostgreSQL; the median of steady-state cycles. Goal: at most 200 ms.
3. ``notice``: a reclaim across the hosts: 12 running 1-GPU training tasks of quota bench-1, all on
   GPUs it borrows, give them back to 8 tasks of the owner, bench-0 (4 of 2 GPUs, 4 of 1 GPU, each
   on one host). The time from the ``preempted`` audit event to the task's
   SIGTERM, p50 and p95 (goal: p95 at most 1 s); and, per owner task, the time from the exit of the
   last victim that held the GPUs it got (the policy holds GPUs per queue and starts whichever
   owner fits first, so an owner may start on another host, where another owner's victims were;
   the victim's exit is its command's last line, written after its checkpoint) to the owner's task
   instance RUNNING (its ``start_date``), p50 and p95 (goal: p95 at most 1 s), with where that time
   goes: the victim's try ending in Airflow (its up_for_reschedule), its host recording its exit
   (the launch row, polled), the executor settling it (``stopped``), admitting the owner, its
   host's worker taking the launch, its task instance running, its command starting. The
   scheduler's idle sleep bounds how soon it settles an exit: ``--idle-sleep`` sets it for this one.

usage: python benchmarks/fleet.py [--only e2e|cycle|notice] [--tasks 300] [--idle-sleep 0.25] [--keep]
PostgreSQL and Redis must answer on 127.0.0.1 (``source scripts/services`` starts them).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.airflow_e2e import DAG as E2E_DAG  # noqa: E402
from tests.fleet_support import CELERY_EXECUTOR, _admin, running_fleet  # noqa: E402
from tests.integration_support import QUOTA_EXECUTOR, free_port, provider_shim  # noqa: E402

HOSTS = ("gpu-a", "gpu-b", "gpu-c")
IDLE_SLEEP_S = "0.25"
GPUS = 4
QUOTAS = """
queues:
  - name: gpu-fleet
    capacity: 12
    quotas:
      - {name: bench-0, capacity: 3, grace_period_s: 30}
      - {name: bench-1, capacity: 3, grace_period_s: 30}
      - {name: bench-2, capacity: 3, grace_period_s: 30}
      - {name: bench-3, capacity: 3, grace_period_s: 30}
"""

NOTICE_DAG = '''
import sys
import pendulum
from airflow.sdk import DAG
from airflow_quota_provider.operators.training import QuotaTrainingOperator

START = pendulum.datetime(2026, 1, 1, tz="UTC")
STUB = {stub!r}
with DAG("notice_low", schedule=None, start_date=START, catchup=False, max_active_tasks=12):
    for i in range(12):  # bench-1 owns no GPU: all 12 are borrowed
        QuotaTrainingOperator(task_id=f"low_{{i:02d}}", quota="bench-1", gpus=1, priority=1,
                              command=[sys.executable, STUB, f"low_{{i:02d}}", "600", "0.5"])
with DAG("notice_high", schedule=None, start_date=START, catchup=False, max_active_tasks=8):
    for i, gpus in enumerate((2, 2, 2, 2, 1, 1, 1, 1)):  # bench-0 takes its 12 GPUs back
        QuotaTrainingOperator(task_id=f"owner_{{i}}_{{gpus}}gpu", quota="bench-0", gpus=gpus, priority=50,
                              command=[sys.executable, STUB, f"owner_{{i}}_{{gpus}}gpu", "2", "0.5"])
'''

NOTICE_QUOTAS = """
queues:
  - name: gpu-fleet
    capacity: 12
    quotas:
      - {name: bench-0, capacity: 12, grace_period_s: 60}
      - {name: bench-1, capacity: 0, grace_period_s: 60}
"""


def _ts(value) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace(" ", "T")).timestamp()


def e2e_once(root: Path, name: str, executor: str, tasks: int) -> float:
    dags = root / f"{name}-dags"
    dags.mkdir(parents=True)
    (dags / "bench_e2e.py").write_text(textwrap.dedent(E2E_DAG.format(tasks=tasks, quotas=4)))
    with running_fleet(
        root / name, quota_file=QUOTAS, dags_folder=dags, hosts=HOSTS, gpus_per_host=GPUS,
        port=free_port(18070, 18099, also=50), redis_db=12, executor=executor,
        extra_env={
            "AIRFLOW__CORE__PARALLELISM": str(max(256, tasks)),
            "AIRFLOW__CORE__MAX_ACTIVE_TASKS_PER_DAG": str(tasks),
            "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "3600",
            # docs/fleet.md's setting: a GPU freed on a host is handed out at the scheduler's next loop
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": IDLE_SLEEP_S,
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        },
    ) as fleet:
        if executor == CELERY_EXECUTOR:  # the same pools, unlimited: only the workers gate
            for q in range(4):
                fleet.airflow("pools", "set", f"bench-{q}", "-1", "benchmark pool")
        run_id = fleet.trigger("bench_e2e")
        state = fleet.wait_run("bench_e2e", run_id, timeout=3600)
        row = fleet.sql("SELECT start_date, end_date FROM dag_run WHERE dag_id='bench_e2e' AND run_id=?", run_id)[0]
        done = fleet.sql("SELECT count(*) AS n FROM task_instance WHERE dag_id='bench_e2e' AND state='success'")[0]["n"]
        if state != "success" or done != tasks:
            raise SystemExit(f"Error: {name}: run {state}, {done}/{tasks} tasks succeeded")
        return _ts(row["end_date"]) - _ts(row["start_date"])


def bench_e2e(root: Path, tasks: int) -> None:
    quota = e2e_once(root, "quota", QUOTA_EXECUTOR, tasks)
    print(f"e2e QuotaExecutor + Celery: {tasks} one-second tasks on {len(HOSTS)} hosts x {GPUS} GPUs: {quota:.1f} s")
    celery = e2e_once(root, "celery", CELERY_EXECUTOR, tasks)
    print(f"e2e CeleryExecutor, the same workers' slots: {celery:.1f} s")
    print(f"e2e ratio QuotaExecutor/CeleryExecutor: {quota / celery:.3f} (goal <= 1.1)")


CYCLE_SCRIPT = r"""
import json, os, statistics, sys, time
from airflow.utils.session import create_session
from airflow_quota_provider.executors.quota_executor import QuotaExecutor
from airflow_quota_provider.models.host import LaunchState, QuotaHost, QuotaLaunch
from airflow_quota_provider.models.job import QuotaDeviceAllocation, QuotaJob

HOSTS, PER_HOST, QUOTAS, WAITING = 250, 8, 20, 10_000
now = time.time()
with create_session() as s:
    for h in range(HOSTS):
        s.add(QuotaHost(name=f"gpu-{h:03d}", queues="fleet", devices=",".join(map(str, range(PER_HOST))),
                        celery_name=f"celery@gpu-{h:03d}", state="active", registered_at=now, heartbeat_at=now + 3600))
    s.flush()
    n = 0
    for h in range(HOSTS):
        for d in range(PER_HOST):
            job = QuotaJob(dag_id="bench", run_id="r", task_id=f"run{n}", map_index=-1, try_number=1,
                           quota=f"q{n % QUOTAS:02d}", queue_name="fleet", gpus=1, priority=50, preemptible=True,
                           state="running", submitted_at=now - 100, started_at=now - 50, host=f"gpu-{h:03d}",
                           handle=f"h{n}", workload="{}")
            s.add(job)
            s.flush()
            s.add(QuotaDeviceAllocation(host=f"gpu-{h:03d}", device=str(d), job_id=job.id, allocated_at=now))
            s.add(QuotaLaunch(handle=f"h{n}", job_id=job.id, host=f"gpu-{h:03d}", state="started", sent_at=now))
            n += 1
    for i in range(WAITING):
        s.add(QuotaJob(dag_id="bench", run_id="r", task_id=f"wait{i}", map_index=-1, try_number=1,
                       quota=f"q{i % QUOTAS:02d}", gpus=1 + i % 4, priority=10, preemptible=True,
                       state="pending", submitted_at=now - 90 + i * 1e-3, workload="{}"))
executor = QuotaExecutor()
executor.start()
times = []
for _ in range(16):
    executor._dirty = True
    t = time.perf_counter()
    executor.sync()
    times.append(time.perf_counter() - t)
with create_session() as s:
    admitted = s.query(QuotaJob).filter(QuotaJob.state == "running", QuotaJob.task_id.like("wait%")).count()
print(json.dumps({"first": times[0], "steady": times[1:], "admitted": admitted}))
"""


def bench_cycle(root: Path) -> None:
    database = f"quota_bench_{os.getpid()}"
    _admin(f"CREATE DATABASE {database}")
    quota_path = root / "cycle-quotas.yaml"
    quotas = "\n".join(f"      - {{name: q{i:02d}, capacity: 100}}" for i in range(20))
    quota_path.write_text(f"queues:\n  - name: fleet\n    capacity: 2000\n    quotas:\n{quotas}\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")},
        "AIRFLOW_HOME": str(root / "cycle"),
        "PYTHONPATH": os.pathsep.join([str(provider_shim(root / "site")), str(ROOT)]),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": QUOTA_EXECUTOR,
        "AIRFLOW__CORE__PARALLELISM": "20000",
        "AIRFLOW__QUOTA__QUOTA_FILE": str(quota_path),
        "AIRFLOW__QUOTA__LAUNCHER": "celery",
        "AIRFLOW__CELERY__BROKER_URL": "redis://127.0.0.1:6379/13",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        # The start-time forecast runs in a thread of its own every 30 s (about 1 s for 10,000
        # waiting jobs, benchmarks/estimate.py); here it would overlap every measured cycle.
        "AIRFLOW__QUOTA__ESTIMATE_INTERVAL_S": "0",
    }
    airflow = str(Path(sys.executable).parent / "airflow")
    try:
        subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
        out = subprocess.run([sys.executable, "-c", CYCLE_SCRIPT], env=env, check=True, capture_output=True,
                             text=True, timeout=1200)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"Error: the cycle benchmark failed:\n{e.stderr[-3000:]}")
    finally:
        _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    if "cycle failed" in out.stderr + out.stdout:
        raise SystemExit(f"Error: a measured cycle failed:\n{(out.stderr + out.stdout)[:6000]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    steady = statistics.median(result["steady"])
    print(f"cycle: sync() with 10,000 waiting and 2,000 running jobs on PostgreSQL: first {result['first'] * 1000:.0f} ms "
          f"(writes 10,000 pending reasons), steady median {steady * 1000:.0f} ms, max {max(result['steady']) * 1000:.0f} ms "
          f"(goal <= 200 ms); admitted {result['admitted']}")


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def _ms(values: list[float]) -> str:
    return f"p50 {statistics.median(values) * 1000:.0f} ms, p95 {_p95(values) * 1000:.0f} ms, max {max(values) * 1000:.0f} ms"


@contextlib.contextmanager
def _launch_exits(fleet) -> Iterator[dict[str, float]]:
    """Task id -> when its launch row first said the task exited (or the launch ended), seen by
    polling the table every 50 ms (the row keeps no time of it)."""
    seen: dict[str, float] = {}
    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(0.05):
            rows = fleet.sql("SELECT DISTINCT j.task_id FROM quota_launch l JOIN quota_job j ON j.id = l.job_id "
                             "WHERE j.dag_id='notice_low' AND l.state IN ('task_exited', 'ended')")
            now = time.time()
            for r in rows:
                seen.setdefault(r["task_id"], now)

    thread = threading.Thread(target=poll, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        thread.join()


def bench_notice(root: Path, idle_sleep_s: str = IDLE_SLEEP_S) -> None:
    dags = root / "notice-dags"
    dags.mkdir(parents=True)
    stub = ROOT / "tests" / "executors" / "train_stub.py"
    (dags / "notice.py").write_text(textwrap.dedent(NOTICE_DAG.format(stub=str(stub))))
    with running_fleet(
        root / "notice", quota_file=NOTICE_QUOTAS, dags_folder=dags, hosts=HOSTS, gpus_per_host=GPUS,
        port=free_port(18070, 18099, also=50), redis_db=12,
        extra_env={"AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": idle_sleep_s, "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING"},
    ) as fleet:
        fleet.trigger("notice_low")
        deadline = time.monotonic() + 600
        while sum(1 for r in fleet.task_records() if r["event"] == "start") < 12:
            if time.monotonic() > deadline:
                raise SystemExit("Error: the 12 low-priority tasks did not all start")
            time.sleep(1)
        high = fleet.trigger("notice_high")
        with _launch_exits(fleet) as exit_recorded:
            if fleet.wait_run("notice_high", high, timeout=1200) != "success":
                raise SystemExit("Error: the owner's run did not succeed")
        preempted = fleet.events("preempted", dag_id="notice_low")
        stopped = {e["task_id"]: e["at"] for e in fleet.events("stopped", dag_id="notice_low")}
        victim_gpus: dict[str, set] = {}  # their GPUs before the reclaim (their first admission)
        for e in fleet.events("admitted", dag_id="notice_low"):
            victim_gpus.setdefault(e["task_id"], {(e["host"], d) for d in e["devices"].split(",")})
        admitted = {e["task_id"]: e for e in fleet.events("admitted", dag_id="notice_high")}
        owners = {str(r["id"]): r["task_id"] for r in fleet.sql("SELECT id, task_id FROM quota_job WHERE dag_id='notice_high'")}
        running = {r["task_id"]: _ts(r["start_date"]) for r in fleet.sql(
            "SELECT task_id, start_date FROM task_instance WHERE dag_id='notice_high' AND run_id=?", high)}
        # The victim's try ended in Airflow: its up_for_reschedule, recorded by the api-server.
        rescheduled = {r["task_id"]: _ts(r["end_date"]) for r in fleet.sql(
            "SELECT ti.task_id, min(tr.end_date) AS end_date FROM task_reschedule tr JOIN task_instance ti ON ti.id = tr.ti_id "
            "WHERE ti.dag_id='notice_low' GROUP BY ti.task_id")}
        picked_up = {r["task_id"]: r["started_at"] for r in fleet.sql(
            "SELECT j.task_id, min(l.started_at) AS started_at FROM quota_launch l JOIN quota_job j ON j.id = l.job_id "
            "WHERE j.dag_id='notice_high' GROUP BY j.task_id")}
        records = fleet.task_records()
    sigterm, exited, started = {}, {}, {}
    for r in records:  # in time order: a victim's first SIGTERM, the last line it wrote after it
        if r["event"] == "sigterm":
            sigterm.setdefault(r["name"], r["t"])
        elif r["name"] in sigterm and r["event"] == "checkpointed":
            exited.setdefault(r["name"], r["t"])
        elif r["event"] == "start" and r["name"] in running:
            started.setdefault(r["name"], r["t"])
    notices = [sigterm[e["task_id"]] - e["at"] for e in preempted if e["task_id"] in sigterm]
    if not notices:
        raise SystemExit("Error: no preemption reached a task")
    print(f"notice: {len(notices)} preemptions across hosts ({sum(e['reason'] == 'reclaim' for e in preempted)} reclaims), "
          f"preempted event -> SIGTERM in the task: {_ms(notices)} (goal p95 <= 1000 ms)")
    victims: dict[str, list[str]] = {}
    for e in preempted:
        victims.setdefault(owners[e["preemptor"]], []).append(e["task_id"])
    victim_host = {e["task_id"]: e["host"] for e in preempted}
    elsewhere = [o for o, names in victims.items() if o in admitted and admitted[o]["host"] not in {victim_host[n] for n in names}]
    steps: dict[str, list[float]] = {}
    for owner in victims:
        if owner not in admitted:
            continue
        # The victims that held the GPUs it got: its own, or, placed on another host (the policy
        # holds GPUs per queue and starts whichever owner fits first), other owners' victims.
        got = {(admitted[owner]["host"], d) for d in admitted[owner]["devices"].split(",")}
        freed = [n for n, held in victim_gpus.items() if held & got and n in exited]
        if not freed:
            continue
        last = max(freed, key=lambda n: exited[n])
        marks = (("victim try ended", rescheduled.get(last)), ("exit recorded", exit_recorded.get(last)),
                 ("settled", stopped.get(last)), ("owner admitted", admitted[owner]["at"]),
                 ("owner launch taken", picked_up.get(owner)), ("owner running", running.get(owner)),
                 ("owner command", started.get(owner)))
        for what, at in marks:
            if at is not None:
                steps.setdefault(what, []).append(at - exited[last])
    reclaim = steps.get("owner running", [])
    if not reclaim:
        raise SystemExit("Error: no owner's start could be matched to its victims' exits")
    print(f"reclaim: {len(reclaim)} owners ({len(elsewhere)} placed on another host than their victims'), the exit of the "
          f"last victim that held its GPUs -> owner task RUNNING: {_ms(reclaim)} (goal p95 <= 1000 ms)")
    print("reclaim: from the last victim's exit, p50 / p95 to: " + "; ".join(
        f"{what} {statistics.median(v) * 1000:.0f} / {_p95(v) * 1000:.0f} ms" for what, v in steps.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("e2e", "cycle", "notice"))
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the AIRFLOW_HOMEs")
    parser.add_argument("--idle-sleep", default=IDLE_SLEEP_S, metavar="S",
                        help=f"notice: [scheduler] scheduler_idle_sleep_time (default {IDLE_SLEEP_S}, docs/fleet.md's)")
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="quota-fleet-bench-"))
    started = time.monotonic()
    try:
        if args.only in (None, "cycle"):
            bench_cycle(root)
        if args.only in (None, "notice"):
            bench_notice(root, args.idle_sleep)
        if args.only in (None, "e2e"):
            bench_e2e(root, args.tasks)
        print(f"(benchmark wall time {time.monotonic() - started:.0f} s, homes under {root})")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
