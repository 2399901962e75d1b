"""Instructions executed by a replay of a slice of the ITP trace: a cost that does not drift with the machine.

    python benchmarks/replay_cost.py [--policy quota] [--first 20000] [--count 8000] [--runtime-noise SIGMA]
                                     [--trace ../shared/traces/itp_elasticflow.csv] [--config examples/itp-quotas.yaml]

On the shared 2-core machines we work on, CPU seconds of the same replay swing by a quarter between
back-to-back runs, so a change that saves a few per cent cannot be seen in them (``simulate.py`` prints
those seconds, the figure the goal is set in). Counted by valgrind (cachegrind without its cache
simulation) with a fixed hash seed, the instructions of the same replay repeat exactly. This script runs the slice (jobs
``first`` to ``first + count`` in submission order, priorities as ``simulate.py`` draws them) under
valgrind twice, once stopping just before the replay, and prints the difference: the replay's own
instructions, with the decisions made and the CPU seconds it took there (about 20 times the usual).
Compare two versions of the code by running it in each checkout. Needs valgrind (``apt-get install
valgrind``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from simulate import PRIORITIES, PRIORITY_SEED, ROOT

from airflow_quota_provider.policy import load_quota_file
from airflow_quota_provider.simulation import assign_priorities, load_trace, parse_priority_classes, simulate
from airflow_quota_provider.simulation.policies import POLICIES


def _replay(args: argparse.Namespace) -> None:
    """Inside valgrind: load the slice and, unless ``--before-replay``, replay it; a JSON line on stdout."""
    jobs, _ = assign_priorities(load_trace(args.trace), parse_priority_classes(PRIORITIES), seed=PRIORITY_SEED)
    jobs = sorted(jobs, key=lambda job: job.submit_time_s)[args.first:args.first + args.count]
    quota_file = load_quota_file(args.config)
    if args.before_replay:
        print(json.dumps({}))
        return
    run = simulate(quota_file, jobs, [args.policy], runtime_noise=args.runtime_noise)
    print(json.dumps({"cpu_s": run.replay_cpu_s[args.policy], "decisions": run.report["policies"][args.policy]["decisions"]}))


def _counted(argv: list[str]) -> tuple[int, dict]:
    """Instructions of this script run with ``argv`` under valgrind, and what it printed."""
    done = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--inside", *argv],
        capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONHASHSEED": "0"},  # str hashes move dict and set layouts, hence the count
    )
    counted = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or counted is None:
        sys.exit(f"valgrind run failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return int(counted.group(1).replace(",", "")), json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT.parent / "shared" / "traces" / "itp_elasticflow.csv")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "itp-quotas.yaml")
    parser.add_argument("--policy", default="quota", choices=POLICIES)
    parser.add_argument("--first", type=int, default=20_000, help="the slice's first job, in submission order")
    parser.add_argument("--count", type=int, default=8_000, help="jobs in the slice")
    parser.add_argument("--runtime-noise", type=float, default=None, metavar="SIGMA",
                        help="expected runtimes, exact (0) or noisy; default: none")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--before-replay", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.first < 0 or args.count < 1:
        parser.error(f"--first {args.first} must be at least 0 and --count {args.count} at least 1")
    if not args.trace.is_file():
        parser.error(f"--trace: {args.trace} not found")
    if args.inside:
        _replay(args)
        return 0
    if shutil.which("valgrind") is None:
        parser.error("valgrind not found: install it (apt-get install valgrind) to count instructions")
    argv = [f"--trace={args.trace}", f"--config={args.config}", f"--policy={args.policy}", f"--first={args.first}",
            f"--count={args.count}"] + ([] if args.runtime_noise is None else [f"--runtime-noise={args.runtime_noise}"])
    total, figures = _counted(argv)
    before, _ = _counted([*argv, "--before-replay"])
    print(f"{args.policy} replay of jobs {args.first:,} to {args.first + args.count:,} of {args.trace.name}"
          + ("" if args.runtime_noise is None else f", runtime noise {args.runtime_noise:g}") + ": "
          f"{(total - before) / 1e6:,.0f} M instructions, {figures['decisions']:,} decisions, "
          f"{figures['cpu_s']:.1f} CPU s under valgrind")
    return 0


if __name__ == "__main__":
    sys.exit(main())
