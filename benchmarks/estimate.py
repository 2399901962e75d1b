"""Time the estimated start of every waiting job at 10,000 waiting jobs (issue 16: under 1 s).

    python benchmarks/estimate.py [--pending N] [--repeat N] [--seed S] [--unknown FRACTION]

The queue is :mod:`benchmarks.decide`'s busy one (2,000 running jobs, 20 quotas, 8,000 GPUs), each
job given an expected runtime drawn from 10 min to 8 h (``--unknown``: that fraction of jobs has
none). Prints the best-of-N time of :func:`~airflow_quota_provider.simulation.forecast.estimate_starts`,
the decisions it made, and how many jobs got an estimate.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from decide import make_state  # noqa: E402

from airflow_quota_provider.policy import State  # noqa: E402
from airflow_quota_provider.simulation.forecast import Forecast  # noqa: E402

GOAL_S = 1.0


def with_runtimes(state: State, now: float, seed: int, unknown: float) -> State:
    rng = random.Random(seed)

    def runtime(job):
        expected = None if rng.random() < unknown else rng.uniform(600, 8 * 3600)
        if job.started_at is not None and expected is not None:
            expected += now - job.started_at - rng.uniform(0, 3600)  # running ones end within the hour or so
        return replace(job, expected_runtime_s=expected)

    return replace(state, running=tuple(map(runtime, state.running)), pending=tuple(map(runtime, state.pending)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--unknown", type=float, default=0.0, help="fraction of jobs without an expected runtime")
    args = parser.parse_args()
    state, now = make_state(args.pending, seed=args.seed)
    state = with_runtimes(state, now, args.seed, args.unknown)
    best = float("inf")
    for _ in range(args.repeat):
        start = time.process_time()
        run = Forecast(state, now)
        starts = run.run()
        best = min(best, time.process_time() - start)
    decisions = run.decisions
    known = [t - now for t in starts.values() if t is not None]
    print(f"pending={args.pending} running={len(state.running)} quotas={len(state.quotas)} unknown runtimes={args.unknown:.0%}: "
          f"{best:.3f} CPU s (best of {args.repeat}), {decisions} decisions; goal < {GOAL_S:g} s: "
          f"{'met' if best < GOAL_S else 'MISSED'}")
    print(f"estimated {len(known)} of {len(starts)}; median start in {statistics.median(known) / 3600:.1f} h, "
          f"latest in {max(known) / 3600:.1f} h" if known else "no estimates")


if __name__ == "__main__":
    main()
