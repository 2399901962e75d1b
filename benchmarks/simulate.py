"""Replay time of the full ITP trace per policy, and Kueue's baseline shape against its lower bound.

    python benchmarks/simulate.py [--trace ../shared/traces/itp_elasticflow.csv]
                                  [--config examples/itp-quotas.yaml] [--policies quota,static,fifo]
                                  [--hosts-per-queue N --gpus-per-host G] [--skip-trace] [--skip-kueue]

Prints, per policy: wall-clock and CPU seconds of the replay, decisions made, and whether it met the
goal of issue 4 (at most 60 s per policy on the 2-core development machine); with hosts, the trace is
replayed on N hosts of G GPUs per job queue (issue 10) and the jobs rejected as larger than a host
are counted. Then, for Kueue's
baseline shape (30 quotas in 5 job queues of 6, capacity 20 each, borrowing; per quota 350 jobs of 1
unit for 0.2 s, 100 of 5 for 0.5 s, 50 of 20 for 1 s, created as Kueue's generator does): makespan
against the lower bound total work / capacity, and the mean wait per size class.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from airflow_quota_provider.policy import load_quota_file
from airflow_quota_provider.simulation import (
    InputError,
    assign_priorities,
    kueue_baseline,
    load_trace,
    parse_priority_classes,
    simulate,
)
from airflow_quota_provider.simulation.policies import POLICIES

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 60.0


def trace_replay(trace: Path, config: Path, policies: list[str], hosts_per_queue: int | None = None,
                 gpus_per_host: int | None = None) -> None:
    jobs = load_trace(trace)
    jobs, _ = assign_priorities(jobs, parse_priority_classes("high=0.2:100,normal=0.8:10"), seed=1)
    quota_file = load_quota_file(config)
    hosts = "" if hosts_per_queue is None else f", {hosts_per_queue} hosts of {gpus_per_host} GPUs per job queue"
    print(f"full trace: {trace.name}, {len(jobs):,} jobs, {config.name}, priorities high=0.2:100,normal=0.8:10 seed 1{hosts}")
    print(f"{'policy':<8} {'wall s':>8} {'CPU s':>8} {'decisions':>10} {'goal <= 60 s':>13}  wait mean s  makespan s"
          + ("  rejected > host" if hosts else ""))
    for policy in policies:
        run = simulate(quota_file, jobs, [policy], hosts_per_queue=hosts_per_queue, gpus_per_host=gpus_per_host)
        overall = run.report["policies"][policy]["overall"]
        wall, cpu = run.replay_s[policy], run.replay_cpu_s[policy]
        print(f"{policy:<8} {wall:8.1f} {cpu:8.1f} {run.report['policies'][policy]['decisions']:>10,} "
              f"{'met' if wall <= GOAL_S else 'MISSED':>13}  {overall['wait_mean_s']:>11,.0f}  {overall['makespan_s']:>10,.0f}"
              + (f"  {overall['rejected_larger_than_host']:>16,}" if hosts else ""), flush=True)


def kueue_shape(policies: list[str]) -> None:
    quota_file, jobs = kueue_baseline()
    capacity = sum(q.capacity for q in quota_file.queues)
    work = sum(j.duration_s * j.gpus for j in jobs)
    bound = work / capacity
    last_arrival = max(j.submit_time_s + j.duration_s for j in jobs)
    print(f"\nKueue baseline shape: {len(jobs):,} jobs, 30 quotas in 5 queues of 6, capacity {capacity}; "
          f"lower bound total work / capacity = {work:g} / {capacity} = {bound:.1f} s "
          f"(last submission + its run time: {last_arrival:.1f} s)")
    print(f"{'policy':<8} {'makespan s':>10} {'/ bound':>8} {'wait small':>11} {'wait medium':>12} {'wait large':>11}"
          f" {'preemptions':>12} {'wall s':>7}")
    for policy in policies:
        run = simulate(quota_file, jobs, [policy], checkpoint_interval_s=0)
        figures = run.report["policies"][policy]
        makespan = figures["overall"]["makespan_s"]
        classes = figures["by_size_class"]
        print(f"{policy:<8} {makespan:10.1f} {makespan / bound:8.3f} {classes['small']['wait_mean_s']:11.2f} "
              f"{classes['medium']['wait_mean_s']:12.2f} {classes['large']['wait_mean_s']:11.2f} "
              f"{figures['overall']['preemptions']:12d} {run.replay_s[policy]:7.1f}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT.parent / "shared" / "traces" / "itp_elasticflow.csv")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "itp-quotas.yaml")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--hosts-per-queue", type=int, default=None, metavar="N")
    parser.add_argument("--gpus-per-host", type=int, default=None, metavar="G")
    parser.add_argument("--skip-trace", action="store_true")
    parser.add_argument("--skip-kueue", action="store_true")
    args = parser.parse_args()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"--policies: {', '.join(unknown)} not one of {', '.join(POLICIES)}")
    if not args.skip_trace:
        if not args.trace.is_file():
            parser.error(f"--trace: {args.trace} not found")
        try:
            trace_replay(args.trace, args.config, policies, args.hosts_per_queue, args.gpus_per_host)
        except InputError as error:
            parser.error(str(error))
    if not args.skip_kueue:
        kueue_shape(policies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
