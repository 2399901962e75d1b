"""Replay time of the full ITP trace per policy, and Kueue's baseline shape against its lower bound.

    python benchmarks/simulate.py [--trace ../shared/traces/itp_elasticflow.csv]
                                  [--config examples/itp-quotas.yaml] [--policies quota,static,fifo]
                                  [--hosts-per-queue N --gpus-per-host G [--gang-reservation-after S] [--seeds SEED,...]]
                                  [--types NAME=SHARE,...]
                                  [--skip-trace] [--skip-kueue]
                                  [--jobs N] [--runtime-noise SIGMA,...] [--spare-finishing-within S,...]
                                  [--builds pure,compiled]

Prints, per policy: wall-clock and CPU seconds of the replay, decisions made, and whether it met the
goal of issue 16 (at most 10 s per policy); with hosts, the trace is replayed on N hosts of G GPUs per
job queue (issue 10): jobs larger than a host run as gangs (issue 32), whose mean wait and that of the
others are set against the pooled replay (no hosts), with the job queues' ``gang_reservation_after_s``
of ``--gang-reservation-after`` if given, and again for each ``--runtime-noise`` with both replays
knowing runtimes (hosts kept for a gang are then backfilled), once per priority draw of ``--seeds``
(judged on the means: one replay's ratios are chaotic); jobs no hosts can hold are counted. With
``--types`` the ``quota`` policy is replayed again with the job queue split into those GPU types (issue
33, each job drawn one type) against the untyped replay. The ``quota`` policy is
replayed again with expected runtimes (exact, and noisy for each ``--runtime-noise`` sigma) to show
the lost GPU-hours with and without them. Then, for Kueue's baseline shape (30 quotas in 5 job
queues of 6, capacity 20 each, borrowing; per quota 350 jobs of 1 unit for 0.2 s, 100 of 5 for 0.5 s,
50 of 20 for 1 s, created as Kueue's generator does): makespan against the lower bound total work /
capacity, the work lost to preemption, and per size class our mean wait and Kueue's own measure of it
(creation to the last admission) beside Kueue's harness (small 215.5 / medium 76.8 / large 16.5 s); the
runs with expected runtimes are repeated with every quota's ``spare_finishing_within_s`` at each
``--spare-finishing-within`` (default 0.5 s, a medium job's run time, and 1.5 s, three). ``--jobs N``
runs N replays at once, one process each (wall seconds then include the machine's contention).
``--builds`` runs everything once per build, one after the other: ``pure`` is the Python source every
checkout runs, ``compiled`` the optional Cython build of the same source that scripts/build-compiled
makes in build/compiled (a C compiler needed).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
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
from airflow_quota_provider.simulation.typesplit import with_types

ROOT = Path(__file__).resolve().parent.parent
GOAL_S = 10.0
PRIORITIES, PRIORITY_SEED = "high=0.2:100,normal=0.8:10", 1
"""The priority classes drawn for the trace's jobs (it has none), and the seed of the draw."""
SPARE_S = (0.5, 1.5)
"""``spare_finishing_within_s`` of the Kueue shape's last rows: a medium job's run time, so a large job
waits for the medium ones it would reclaim rather than make them run again, and three, to absorb noisy
estimates (a medium job expected to end within it or outliving its estimate by less)."""
KUEUE_WAIT_S = {"small": 215.5, "medium": 76.8, "large": 16.5}
"""Mean time to admission per size class in Kueue's own performance harness for this shape: the averages
in the comments of its ``test/performance/scheduler/configs/baseline/rangespec.yaml`` (small 215468 ms,
medium 76768 ms; large 16501 ms since kubernetes-sigs/kueue#11097 turned SchedulingEquivalenceHashing on,
6666 ms before). Its recorder (``runner/recorder/recorder.go``) measures a workload's creation to its
last admission: an evicted workload's time counts again from its creation."""


def _classes(seconds: dict[str, float]) -> str:
    return " / ".join(f"{seconds[size]:.2f}" for size in KUEUE_WAIT_S)


def _to_last_admission(jobs) -> dict[str, float]:
    """Mean seconds from submission to the start of the attempt that finished, per size class (Kueue's
    ``averageTimeToAdmissionMs``: unlike our wait, a preempted job's lost run counts)."""
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for job in jobs:
        if job.first_start is not None:
            total[job.trace.size_class] = total.get(job.trace.size_class, 0.0) + job.start - job.trace.submit_time_s
            count[job.trace.size_class] = count.get(job.trace.size_class, 0) + 1
    return {size: total[size] / count[size] for size in total}


def _replay(args: tuple) -> tuple:
    """One replay in a worker process: (wall s, CPU s, policy's figures, jobs, mean waits of the jobs
    larger than ``split`` GPUs and of the others; None without ``split``)."""
    trace, config, policy, hosts_per_queue, gpus_per_host, noise, types, reservation, seed, *split = args
    jobs = load_trace(trace)
    jobs, _ = assign_priorities(jobs, parse_priority_classes(PRIORITIES), seed=seed)
    quota_file = load_quota_file(config)
    if reservation is not None:
        quota_file = replace(quota_file, queues=tuple(replace(q, gang_reservation_after_s=reservation or None)
                                                      for q in quota_file.queues))
    if types is not None:
        quota_file, jobs = with_types(quota_file, jobs, types, gpus_per_host, seed)
    run = simulate(quota_file, jobs, [policy], hosts_per_queue=hosts_per_queue,
                   gpus_per_host=gpus_per_host, runtime_noise=noise)
    waits = None
    if split:
        ran = [j for j in run.results[policy].jobs if j.first_start is not None]
        large = [j.wait for j in ran if j.trace.gpus > split[0]]
        rest = [j.wait for j in ran if j.trace.gpus <= split[0]]
        waits = (sum(large) / max(1, len(large)), sum(rest) / max(1, len(rest)), len(large))
    return run.replay_s[policy], run.replay_cpu_s[policy], run.report["policies"][policy], len(jobs), waits


def _label(policy: str, noise: float | None) -> str:
    if noise is None:
        return policy
    return f"{policy}+runtimes" + ("" if noise == 0 else f" σ{noise:g}")


def trace_replay(trace: Path, config: Path, policies: list[str], hosts_per_queue: int | None = None,
                 gpus_per_host: int | None = None, jobs_at_once: int = 1, noises: list[float] = ()) -> None:
    runs = [(policy, None) for policy in policies]
    if "quota" in policies:
        runs += [("quota", noise) for noise in noises]
    hosts = "" if hosts_per_queue is None else f", {hosts_per_queue} hosts of {gpus_per_host} GPUs per job queue"
    print(f"full trace: {trace.name}, {config.name}, priorities {PRIORITIES} seed {PRIORITY_SEED}{hosts}; "
          f"{len(runs)} replays, {jobs_at_once} at once")
    print(f"{'policy':<18} {'wall s':>8} {'CPU s':>8} {'decisions':>10} {'goal <= 10 s':>13}  wait mean s  makespan s"
          f"  preemptions  lost GPU-h" + ("  rejected > host" if hosts else ""))
    work = [(trace, config, policy, hosts_per_queue, gpus_per_host, noise, None, None, PRIORITY_SEED) for policy, noise in runs]
    with ProcessPoolExecutor(max_workers=jobs_at_once) as pool:
        for (policy, noise), (wall, cpu, figures, _, _) in zip(runs, pool.map(_replay, work)):
            overall = figures["overall"]
            print(f"{_label(policy, noise):<18} {wall:8.1f} {cpu:8.1f} {figures['decisions']:>10,} "
                  f"{'met' if cpu <= GOAL_S else 'MISSED':>13}  {overall['wait_mean_s']:>11,.0f}  "
                  f"{overall['makespan_s']:>10,.0f}  {overall['preemptions']:>11,}  {overall['lost_gpu_hours']:>10,.0f}"
                  + (f"  {overall['rejected_larger_than_host']:>16,}" if hosts else ""), flush=True)


def gangs_against_pooled(trace: Path, config: Path, hosts_per_queue: int, gpus_per_host: int, jobs_at_once: int = 1,
                         reservation: float | None = None, noises: list[float] = (),
                         seeds: list[int] = (PRIORITY_SEED,)) -> None:
    """Issue 32's figures: the ``quota`` policy on the hosts (jobs larger than a host run as gangs)
    against the same replay without hosts (every job pooled), mean wait of the jobs larger than a host
    and of the others (goals: at most 1.5 and 1.1 times the pooled ones). ``reservation``: the job
    queues' ``gang_reservation_after_s`` instead of the quota file's (0: none). Without runtimes, then
    with them for each of ``noises`` (both replays alike): hosts kept for a gang are backfilled only
    with jobs expected to end before it has room there. Once per priority draw of ``seeds``: one
    decision changes every later one, so one draw's ratios move by a tenth with any setting; with
    several, the goals are judged on their means."""
    goals = ((f"> {gpus_per_host} GPUs (gangs)", 0, 1.5), (f"<= {gpus_per_host} GPUs", 1, 1.1))
    for noise in (None, *noises):
        work = [(trace, config, "quota", h, g, noise, None, reservation, seed, gpus_per_host)
                for seed in seeds for h, g in ((hosts_per_queue, gpus_per_host), (None, None))]
        with ProcessPoolExecutor(max_workers=jobs_at_once) as pool:
            results = list(pool.map(_replay, work))
        ratios: list[tuple[float, float]] = []
        for seed, (_, cpu, figures, _, placed), (_, pooled_cpu, _, _, pooled) in zip(seeds, results[::2], results[1::2]):
            overall = figures["overall"]
            print(f"gangs ({_label('quota', noise)}, priority seed {seed}): {hosts_per_queue} hosts of {gpus_per_host} "
                  f"GPUs per job queue against no hosts; {placed[2]:,} jobs larger than a host ran as "
                  f"{overall['gang_jobs']:,} gangs, {overall['rejected']:,} rejected; replay {cpu:.1f} s CPU "
                  f"(no hosts {pooled_cpu:.1f} s)")
            ratios.append(tuple(placed[i] / pooled[i] if pooled[i] else float("nan") for i in (0, 1)))
            for label, index, goal in goals:
                print(f"  {label:<18} mean wait {placed[index]:>9,.0f} s  no hosts {pooled[index]:>9,.0f} s  "
                      f"ratio {ratios[-1][index]:.2f} (goal <= {goal}: {'met' if ratios[-1][index] <= goal else 'MISSED'})",
                      flush=True)
        if len(seeds) > 1:
            print(f"gangs ({_label('quota', noise)}): mean over priority seeds {', '.join(map(str, seeds))}")
            for label, index, goal in goals:
                each = [r[index] for r in ratios]
                mean = sum(each) / len(each)
                print(f"  {label:<18} ratio {mean:.2f} ({min(each):.2f}-{max(each):.2f}) "
                      f"(goal <= {goal}: {'met' if mean <= goal else 'MISSED'})", flush=True)


def types_against_untyped(trace: Path, config: Path, types: str, hosts_per_queue: int | None,
                          gpus_per_host: int | None, jobs_at_once: int = 1) -> None:
    """Issue 33: the ``quota`` policy with the job queue split into GPU types (``--types``: each job
    drawn a type by the shares, so it may run on that type only) against the same replay untyped:
    replay time and mean wait, the price of binding jobs to types."""
    work = [(trace, config, "quota", hosts_per_queue, gpus_per_host, None, t, None, PRIORITY_SEED) for t in (types, None)]
    with ProcessPoolExecutor(max_workers=jobs_at_once) as pool:
        (_, cpu, typed, _, _), (_, untyped_cpu, untyped, _, _) = pool.map(_replay, work)
    wait, untyped_wait = typed["overall"]["wait_mean_s"], untyped["overall"]["wait_mean_s"]
    print(f"types: quota policy split into {types} (each job drawn one type) against untyped; replay "
          f"{cpu:.1f} s CPU (untyped {untyped_cpu:.1f} s, ratio {cpu / untyped_cpu:.2f}); mean wait {wait:,.0f} s "
          f"(untyped {untyped_wait:,.0f} s, ratio {wait / untyped_wait:.2f}); rejected {typed['overall']['rejected']:,} "
          f"(untyped {untyped['overall']['rejected']:,})", flush=True)


def kueue_shape(policies: list[str], noises: list[float] = (), spares: tuple[float, ...] = SPARE_S) -> None:
    quota_file, jobs = kueue_baseline()
    capacity = sum(q.capacity for q in quota_file.queues)
    work = sum(j.duration_s * j.gpus for j in jobs)
    bound = work / capacity
    last_arrival = max(j.submit_time_s + j.duration_s for j in jobs)
    print(f"\nKueue baseline shape: {len(jobs):,} jobs, 30 quotas in 5 queues of 6, capacity {capacity}; "
          f"lower bound total work / capacity = {work:g} / {capacity} = {bound:.1f} s "
          f"(last submission + its run time: {last_arrival:.1f} s)")
    kueue = KUEUE_WAIT_S
    print(f"{'policy':<31} {'makespan s':>10} {'/ bound':>8} {'lost work':>10} {'preemptions':>12} "
          f"{'wait mean s S / M / L':>24} {'to last admission s S / M / L':>31} {'wall s':>7}")
    print(f"{'Kueue (its harness)':<31} {'':>10} {'':>8} {'':>10} {'':>12} {'':>24} {_classes(kueue):>31}")
    runs = [(policy, None, 0.0) for policy in policies]
    if "quota" in policies:
        runs += [("quota", n, 0.0) for n in noises] + [("quota", n, s) for s in spares for n in noises]
    for policy, noise, spare in runs:
        config = kueue_baseline(spare_finishing_within_s=spare)[0] if spare else quota_file
        run = simulate(config, jobs, [policy], checkpoint_interval_s=0, runtime_noise=noise)
        figures = run.report["policies"][policy]
        makespan = figures["overall"]["makespan_s"]
        classes = figures["by_size_class"]
        admitted = _to_last_admission(run.results[policy].jobs)
        lost = figures["overall"]["lost_gpu_hours"] * 3600.0 / work
        waits = {size: classes[size]["wait_mean_s"] for size in KUEUE_WAIT_S}
        label = _label(policy, noise) + (f" spare {spare:g}s" if spare else "")
        print(f"{label:<31} {makespan:10.1f} {makespan / bound:8.3f} {lost:10.1%} "
              f"{figures['overall']['preemptions']:12d} {_classes(waits):>24} {_classes(admitted):>31} "
              f"{run.replay_s[policy]:7.1f}", flush=True)


def _numbers(parser: argparse.ArgumentParser, flag: str, text: str) -> list[float]:
    try:
        return [float(n) for n in text.split(",") if n.strip()]
    except ValueError:
        parser.error(f"{flag}: {text!r} is not a list of numbers")


BUILDS = ("pure", "compiled")


def _running_build() -> str:
    import airflow_quota_provider.policy.cycle as cycle

    return "pure" if cycle.__file__.endswith(".py") else "compiled"


def _each_build(builds: list[str]) -> int:
    """This script again, once per build, each in a process whose path holds that build first."""
    argv, given = [], iter(sys.argv[1:])
    for arg in given:  # every argument but --builds
        if arg == "--builds":
            next(given, None)
        elif not arg.startswith("--builds="):
            argv.append(arg)
    failed = 0
    for build in builds:
        path = ROOT
        if build == "compiled":
            path = ROOT / "build" / "compiled"
            subprocess.run([str(ROOT / "scripts" / "build-compiled"), str(path)], check=True, stdout=subprocess.DEVNULL,
                           env={**os.environ, "PYTHON": sys.executable})
        print(f"\n== {build} build ==", flush=True)
        failed |= subprocess.run([sys.executable, __file__, *argv, "--builds", build],
                                 env={**os.environ, "PYTHONPATH": str(path)}).returncode
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT.parent / "shared" / "traces" / "itp_elasticflow.csv")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "itp-quotas.yaml")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--hosts-per-queue", type=int, default=None, metavar="N")
    parser.add_argument("--gpus-per-host", type=int, default=None, metavar="G")
    parser.add_argument("--gang-reservation-after", type=float, default=None, metavar="S",
                        help="with --hosts-per-queue: the job queues' gang_reservation_after_s for the gang figures "
                             "instead of the quota file's (0: none)")
    parser.add_argument("--seeds", default=str(PRIORITY_SEED), metavar="SEED,...",
                        help="with --hosts-per-queue: priority draws of the gang figures, judged on their means")
    parser.add_argument("--types", default=None, metavar="NAME=SHARE,...",
                        help="also replay quota with the queue split into these GPU types, against untyped")
    parser.add_argument("--skip-trace", action="store_true")
    parser.add_argument("--skip-kueue", action="store_true")
    parser.add_argument("--jobs", type=int, default=1, metavar="N", help="replays at once (processes)")
    parser.add_argument("--spare-finishing-within", default=",".join(f"{s:g}" for s in SPARE_S), metavar="S,...",
                        help="Kueue shape: spare_finishing_within_s of the repeated runs with runtimes; empty: none")
    parser.add_argument("--runtime-noise", default="0,0.5", metavar="SIGMA,...",
                        help="replay quota again with expected runtimes, exact (0) or noisy; empty: none")
    parser.add_argument("--builds", default=",".join(BUILDS), metavar="BUILD,...",
                        help="pure (the checkout's Python source) and/or compiled (scripts/build-compiled)")
    args = parser.parse_args()
    builds = [b.strip() for b in args.builds.split(",") if b.strip()]
    if not builds or any(b not in BUILDS for b in builds):
        parser.error(f"--builds: {args.builds!r} must name some of {', '.join(BUILDS)}")
    if builds != [_running_build()]:
        return _each_build(builds)
    if args.jobs < 1:
        parser.error(f"--jobs: {args.jobs} must be at least 1")
    noises = _numbers(parser, "--runtime-noise", args.runtime_noise)
    seeds = _numbers(parser, "--seeds", args.seeds)
    if not seeds or any(s != int(s) or s < 0 for s in seeds):
        parser.error(f"--seeds: {args.seeds!r} must be integers from 0")
    seeds = [int(s) for s in seeds]
    spares = _numbers(parser, "--spare-finishing-within", args.spare_finishing_within)
    if any(not s > 0 for s in spares):
        parser.error(f"--spare-finishing-within: {args.spare_finishing_within} must be seconds above 0")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        parser.error(f"--policies: {', '.join(unknown)} not one of {', '.join(POLICIES)}")
    if not args.skip_trace:
        if not args.trace.is_file():
            parser.error(f"--trace: {args.trace} not found")
        try:
            trace_replay(args.trace, args.config, policies, args.hosts_per_queue, args.gpus_per_host, args.jobs, noises)
            if args.hosts_per_queue is not None and "quota" in policies:
                gangs_against_pooled(args.trace, args.config, args.hosts_per_queue, args.gpus_per_host, args.jobs,
                                     args.gang_reservation_after, noises, seeds)
            if args.types is not None and "quota" in policies:
                types_against_untyped(args.trace, args.config, args.types, args.hosts_per_queue, args.gpus_per_host,
                                      args.jobs)
        except InputError as error:
            parser.error(str(error))
    if not args.skip_kueue:
        kueue_shape(policies, noises, tuple(spares))
    return 0


if __name__ == "__main__":
    sys.exit(main())
