"""One scheduler against two: the fault suite's workload (``tests/faults/dags/ha_workload.py``, N
tasks over four quotas, a low-priority DAG that borrows and a high-priority one that reclaims) on
the same fleet of 3 hosts x 4 virtual GPUs, PostgreSQL and Redis, with one and then with two
schedulers. Prints, for each: wall time (first admission to last release), decisions per second
(admissions and preemptions over the wall time), the p50/p95 time from "admitted" to "running"
(the launch taken by its host), the over-admissions found by replaying the audit log, and where the
CPU went: the machine's busy share and the CPU seconds of each part of the fleet.
Goal: two schedulers no slower than one; 0 over-admissions. Figures are printed, never asserted.

The GPU hosts' task runners use three quarters of the CPU (about 1 CPU-s per launch, Airflow's own
supervisor and task runner), so on one small machine a second scheduler's CPU is taken from the
tasks and the run measures CPU contention, not scheduling. By default (``--layout separate``) the
schedulers therefore run on the first CPU and the api-server, dag-processor and hosts on the others,
as schedulers and GPU hosts are different machines in production; ``--layout shared`` runs them all
on every CPU.

usage: python benchmarks/ha.py [--tasks 500] [--schedulers 1,2] [--layout separate|shared] [--keep]
PostgreSQL and Redis must answer on 127.0.0.1 (``source scripts/services`` starts them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.faults.test_faults import DAGS, GPUS_PER_HOST, HOSTS, QUOTAS, replay_allocations  # noqa: E402
from tests.fleet_support import running_fleet  # noqa: E402
from tests.integration_support import free_port, wait_for  # noqa: E402


TICK = os.sysconf("SC_CLK_TCK")


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields) - idle) / TICK, sum(fields) / TICK


def postgres_cpu() -> float:
    """CPU seconds of PostgreSQL's server: its live processes, and the backends its postmaster reaped."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            head, rest = stat.read_text().rsplit(")", 1)
        except OSError:
            continue
        if head.endswith("(postgres"):
            total += sum(int(v) for v in rest.split()[11:15])
    return total / TICK


def fleet_cpu(fleet) -> dict[str, float]:
    """CPU seconds so far of each part of the fleet: its Airflow processes, its hosts, PostgreSQL."""
    cpu = {name: session_cpu(proc.pid) for name, proc in fleet.procs.items()}
    cpu["hosts"] = sum(session_cpu(proc.pid) for proc in fleet.workers.values())
    cpu["postgres"] = postgres_cpu()
    return cpu


def session_cpu(sid: int) -> float:
    """CPU seconds used so far by the live processes of session ``sid`` and their reaped children."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        if int(fields[3]) == sid:  # fields[0] is field 3 of proc(5), the state
            total += sum(int(v) for v in fields[11:15])  # utime stime cutime cstime
    return total / TICK


def pin(pid: int, cpus: set[int]) -> None:
    """Run process ``pid`` and its descendants, every thread of each, on ``cpus`` (what they fork or
    start later inherits it)."""
    tree = [pid]
    while tree:
        for task in Path(f"/proc/{tree.pop()}/task").glob("*"):
            with contextlib.suppress(OSError):  # gone meanwhile
                os.sched_setaffinity(int(task.name), cpus)
                tree.extend(int(child) for child in (task / "children").read_text().split())


def run(root: Path, tasks: int, schedulers: int, separate: bool) -> dict:
    cpus = os.sched_getaffinity(0)
    if separate:  # what the fleet starts inherits the rest of the CPUs; the schedulers get the first
        os.sched_setaffinity(0, cpus - {min(cpus)})
    with contextlib.ExitStack() as stack:
        if separate:
            stack.callback(os.sched_setaffinity, 0, cpus)
        fleet = stack.enter_context(running_fleet(
            root / f"schedulers-{schedulers}",
            quota_file=QUOTAS,
            dags_folder=DAGS,
            hosts=HOSTS,
            gpus_per_host=GPUS_PER_HOST,
            port=free_port(18350, 18399, also=50),
            redis_db=8,
            extra_env={
                "QUOTA_HA_TASKS": str(tasks),
                "AIRFLOW__CORE__PARALLELISM": "1024",
                "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": "0.25",
                "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
            },
        ))
        for n in range(2, schedulers + 1):
            fleet.start_process(f"scheduler-{n}", "scheduler")
        if separate:
            for name, proc in fleet.procs.items():
                if name.startswith("scheduler"):
                    pin(proc.pid, {min(cpus)})
        busy0, total0 = machine_cpu()
        cpu0 = fleet_cpu(fleet)
        low = fleet.trigger("ha_low")
        wait_for(lambda: len(fleet.events("admitted")) >= 8, "the fleet to fill", timeout=300)
        high = fleet.trigger("ha_high")
        states = (fleet.wait_run("ha_low", low, timeout=3600), fleet.wait_run("ha_high", high, timeout=3600))
        wait_for(lambda: not fleet.sql("SELECT 1 FROM quota_job WHERE state IN ('running', 'stopping')"),
                 "every job to settle", timeout=300)
        busy1, total1 = machine_cpu()
        cpu = {name: s - cpu0[name] for name, s in fleet_cpu(fleet).items()}
        events = fleet.sql("SELECT kind, at, job_id, message FROM quota_event WHERE kind IN "
                           "('admitted', 'preempted', 'released') ORDER BY id")
        starts = fleet.sql(
            "SELECT l.started_at - e.at AS wait FROM quota_launch l JOIN quota_event e ON e.job_id = l.job_id "
            "AND e.kind = 'admitted' AND e.at <= l.sent_at + 1 AND l.started_at IS NOT NULL "
            "AND NOT EXISTS (SELECT 1 FROM quota_event e2 WHERE e2.job_id = e.job_id AND e2.kind = 'admitted' "
            "AND e2.at > e.at AND e2.at <= l.sent_at + 1)"
        )
        try:
            replay_allocations(fleet)
            over = 0
        except AssertionError as e:
            print(f"  over-admission: {e}")
            over = 1
        retries = fleet.sql("SELECT count(*) AS n FROM task_instance WHERE try_number > 1 OR state != 'success'")[0]["n"]
    at = [e["at"] for e in events]
    wall = max(at) - min(at)
    decisions = sum(e["kind"] in ("admitted", "preempted") for e in events)
    waits = sorted(r["wait"] for r in starts)
    return {
        "states": states, "wall": wall, "decisions": decisions, "rate": decisions / wall,
        "p50": statistics.median(waits), "p95": waits[int(0.95 * (len(waits) - 1))],
        "preempted": sum(e["kind"] == "preempted" for e in events), "over": over, "retries": retries,
        "busy": (busy1 - busy0) / (total1 - total0), "cpu": cpu,
        "deciders": len({e["message"] for e in events if e["kind"] == "admitted" and e["message"]}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--schedulers", default="1,2", help="the runs: how many schedulers each has")
    parser.add_argument(
        "--layout", choices=("separate", "shared"), default="separate",
        help="separate: the schedulers on the first CPU, the rest of the fleet on the others, as "
             "schedulers and GPU hosts are different machines in production; shared: all on every CPU")
    parser.add_argument("--keep", action="store_true", help="keep the Airflow homes for a look")
    args = parser.parse_args(argv)
    try:
        counts = [int(n) for n in args.schedulers.split(",")]
    except ValueError:
        parser.error(f"--schedulers: {args.schedulers!r} is not a list of numbers, e.g. 1,2")
    if any(n < 1 for n in counts):
        parser.error(f"--schedulers: {args.schedulers!r}: each run needs at least 1 scheduler")
    cpus = sorted(os.sched_getaffinity(0))
    separate = args.layout == "separate"
    if separate and len(cpus) < 2:
        parser.error("--layout separate needs at least 2 CPUs; use --layout shared")
    print(f"layout: {args.layout}: " + (
        f"schedulers on CPU {cpus[0]}, api-server, dag-processor and hosts on CPUs {cpus[1:]}"
        " (PostgreSQL and Redis anywhere)" if separate else f"the whole fleet on CPUs {cpus}"))
    root = Path(tempfile.mkdtemp(prefix="quota-ha-bench-"))
    try:
        results = {}
        for schedulers in counts:
            r = results[schedulers] = run(root, args.tasks, schedulers, separate)
            print(
                f"{schedulers} scheduler(s), {args.tasks} tasks: runs {r['states']}, wall {r['wall']:.1f} s, "
                f"{r['decisions']} decisions ({r['preempted']} preemptions, by {r['deciders']} scheduler(s)) = "
                f"{r['rate']:.2f}/s, admitted->running p50 {r['p50'] * 1000:.0f} ms p95 {r['p95'] * 1000:.0f} ms, "
                f"over-admissions {r['over']}, tasks retried or not successful {r['retries']}"
            )
            print(f"  machine CPU busy {r['busy']:.0%} of {os.cpu_count()} cores; CPU s: "
                  + ", ".join(f"{name} {s:.1f}" for name, s in sorted(r["cpu"].items())))
        if 1 in results and 2 in results:
            print(f"wall ratio two/one schedulers: {results[2]['wall'] / results[1]['wall']:.3f} (goal <= 1.0)")
    finally:
        if args.keep:
            print(f"(homes under {root})")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
