"""Command line: ``python -m airflow_quota_provider.simulation run ...`` (also ``airflow quota simulate``).

Bad input exits with status 2 and one line ``Error: <argument>: <what is wrong>``; a run that breaks
one of its built-in checks exits with status 1. The figures go to ``--json``; a short table goes to
standard output; replay times and the progress bar go to standard error.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from airflow_quota_provider.policy import PolicyError, load_quota_file
from airflow_quota_provider.simulation.engine import CheckError
from airflow_quota_provider.simulation.policies import POLICIES
from airflow_quota_provider.simulation.runner import DEFAULT_CHECKPOINT_INTERVAL_S, Run, simulate
from airflow_quota_provider.simulation.typesplit import with_types
from airflow_quota_provider.simulation.workload import (
    InputError,
    assign_priorities,
    kueue_baseline,
    load_trace,
    parse_priority_classes,
    select_days,
    write_trace,
)


def _days(text: str) -> float:
    value = float(text)  # ValueError -> argparse names the argument
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of days, at least 0")
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds, at least 0 (0: no checkpoints)")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


_days.__name__ = "days"
def _sigma(text: str) -> float:
    value = float(text)
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a standard deviation, at least 0 (0: exact runtimes)")
    return value


_seconds.__name__ = "seconds"
_sigma.__name__ = "sigma"
_count.__name__ = "count"

# (flags, argparse keyword arguments): the one definition of the options, for both command lines.
SIMULATE_ARGS: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] = (
    (("--trace",), {"required": True, "metavar": "CSV",
                    "help": "workload: job_id,team,submit_time_s,duration_s,gpus[,priority][,checkpoint_interval_s]"}),
    (("--config",), {"required": True, "metavar": "QUOTAS.yaml", "help": "the quota file to evaluate"}),
    (("--policy",), {"default": "all", "choices": (*POLICIES, "all"),
                     "help": "quota: the file as given; static: each quota only its capacity; fifo: one shared "
                             "FIFO; all: the three (default)"}),
    (("--from-day",), {"type": _days, "default": None, "metavar": "D", "help": "replay jobs submitted from day D"}),
    (("--to-day",), {"type": _days, "default": None, "metavar": "D", "help": "... and before day D"}),
    (("--priority-classes",), {"default": None, "metavar": "NAME=SHARE:PRIORITY,...",
                               "help": "draw priorities for jobs without one, e.g. high=0.2:100,normal=0.8:10"}),
    (("--seed",), {"type": int, "default": 1, "help": "seed of the priority and --types draws (default 1)"}),
    (("--checkpoint-interval",), {"type": _seconds, "default": DEFAULT_CHECKPOINT_INTERVAL_S, "metavar": "S",
                                  "help": "run time between checkpoints for jobs without checkpoint_interval_s "
                                          f"(default {DEFAULT_CHECKPOINT_INTERVAL_S:g}; 0: none)"}),
    (("--hosts-per-queue",), {"type": _count, "default": None, "metavar": "N",
                              "help": "place jobs on N hosts per job queue, each job on one host (with "
                                      "--gpus-per-host; N x G must be each queue's capacity)"}),
    (("--gpus-per-host",), {"type": _count, "default": None, "metavar": "G",
                            "help": "GPUs per host (with --hosts-per-queue); jobs above G GPUs run as gangs of hosts"}),
    (("--types",), {"default": None, "metavar": "NAME=SHARE,...",
                    "help": "split each job queue's capacity into GPU types by these shares, in this order of "
                            "preference (on hosts: whole hosts per type), and draw a type for each job without "
                            "one by the same shares (with --seed), e.g. h100=0.25,a100=0.5,l4=0.25"}),
    (("--runtime-noise",), {"type": _sigma, "default": None, "metavar": "SIGMA",
                            "help": "tell the policy each job's expected runtime: its work left times "
                                    "exp(N(0, SIGMA)) (0: exact); default: runtimes unknown"}),
    (("--runtime-seed",), {"type": int, "default": 1, "help": "seed of the runtime noise (default 1)"}),
    (("--json",), {"default": None, "metavar": "OUT.json", "help": "write the figures here"}),
    (("--plot",), {"default": None, "metavar": "OUT.png", "help": "plot busy GPUs and waiting jobs here"}),
)


def add_simulate_arguments(parser: argparse.ArgumentParser) -> None:
    for flags, kwargs in SIMULATE_ARGS:
        parser.add_argument(*flags, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m airflow_quota_provider.simulation",
                                     description="Replay a workload through the quota policy and its baselines.")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="replay a trace under one or all policies")
    add_simulate_arguments(run)
    shape = commands.add_parser("kueue-shape", help="write Kueue's baseline workload as a trace and quota file")
    shape.add_argument("--out-dir", required=True, metavar="DIR")
    return parser


class _Progress:
    """A rich progress bar over simulated time, one line per policy; silent when not on a terminal."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        console = Console(stderr=True)
        self.progress = Progress(TextColumn("{task.description:>8}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                                 TimeElapsedColumn(), console=console, transient=False,
                                 disable=not console.is_terminal)
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> _Progress:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for task in self.tasks.values():
            self.progress.update(task, completed=1.0)
        self.progress.__exit__(*exc)

    def __call__(self, policy: str, start: float, now: float, end: float) -> None:
        if policy not in self.tasks:
            for task in self.tasks.values():
                self.progress.update(task, completed=1.0)
            self.tasks[policy] = self.progress.add_task(policy, total=1.0)
        fraction = (now - start) / (end - start) if end > start else 1.0
        self.progress.update(self.tasks[policy], completed=min(1.0, fraction))


def run_from_args(args: argparse.Namespace) -> Run:
    """Load, replay, check and write what ``args`` asks for; raises InputError / PolicyError / CheckError."""
    try:
        quota_file = load_quota_file(args.config)
    except PolicyError as error:
        raise InputError("--config", str(error)) from None
    classes = parse_priority_classes(args.priority_classes) if args.priority_classes else None
    jobs = load_trace(args.trace)
    jobs, class_names = assign_priorities(jobs, classes, args.seed)
    jobs = select_days(jobs, args.from_day, args.to_day)
    if args.types is not None:
        quota_file, jobs = with_types(quota_file, jobs, args.types, args.gpus_per_host, args.seed)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise InputError("--plot", "needs matplotlib (pip install 'airflow-quota-provider[simulation]')") from None
    for target, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if target is not None and not Path(target).resolve().parent.is_dir():
            raise InputError(flag, f"directory of {target} does not exist")
    policies = list(POLICIES) if args.policy == "all" else [args.policy]
    workload = {
        "trace": Path(args.trace).name,
        "config": Path(args.config).name,
        "from_day": args.from_day,
        "to_day": args.to_day,
        "priority_classes": args.priority_classes,
        "seed": args.seed if classes or args.types else None,
        **({"types": args.types} if args.types else {}),
    }
    with _Progress() as progress:
        run = simulate(quota_file, jobs, policies, checkpoint_interval_s=args.checkpoint_interval,
                       record_timeline=args.plot is not None, progress=progress, workload=workload,
                       hosts_per_queue=args.hosts_per_queue, gpus_per_host=args.gpus_per_host,
                       runtime_noise=args.runtime_noise, runtime_seed=args.runtime_seed)
    if args.json:
        Path(args.json).write_text(json.dumps(run.report, indent=2) + "\n")
    if args.plot:
        from airflow_quota_provider.simulation.plot import plot

        plot(run.results, args.plot, title=f"{Path(args.trace).name} on {Path(args.config).name}")
    return run


def format_table(report: dict[str, Any]) -> str:
    columns = ("jobs", "rejected", "utilisation", "wait_mean_s", "wait_p95_s", "in_quota_wait_p95_s",
               "borrowed_gpu_hours", "preemptions", "lost_gpu_hours", "reclaim_latency_p95_s", "makespan_s")
    lines = ["policy  " + "  ".join(columns)]
    for name, figures in report["policies"].items():
        overall = figures["overall"]
        cells = []
        for column in columns:
            value = overall[column]
            cells.append(("-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value))
                         .rjust(len(column)))
        lines.append(f"{name:<8}" + "  ".join(cells))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "kueue-shape":
            return _kueue_shape(Path(args.out_dir))
        run = run_from_args(args)
    except (InputError, PolicyError) as error:
        print(f"Error: {error}", file=sys.stderr)
        return 2
    except CheckError as error:
        print(f"Error: check failed: {error}", file=sys.stderr)
        return 1
    print(format_table(run.report))
    for name, seconds in run.replay_s.items():
        print(f"replay {name}: {seconds:.1f} s ({run.replay_cpu_s[name]:.1f} s CPU, "
              f"{run.report['policies'][name]['decisions']} decisions)", file=sys.stderr)
    return 0


def _kueue_shape(out_dir: Path) -> int:
    import yaml

    from airflow_quota_provider.policy import quota_to_dict

    if not out_dir.is_dir():
        raise InputError("--out-dir", f"{out_dir} is not a directory")
    quota_file, jobs = kueue_baseline()
    write_trace(jobs, out_dir / "kueue-baseline.csv")
    data = {"queues": [{"name": q.name, "capacity": q.capacity, "quotas": [quota_to_dict(x) for x in q.quotas]}
                       for q in quota_file.queues]}
    (out_dir / "kueue-baseline-quotas.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    print(f"wrote {out_dir / 'kueue-baseline.csv'} and {out_dir / 'kueue-baseline-quotas.yaml'}")
    return 0
