"""Time the estimated start of every waiting job at 10,000 waiting jobs (issue 16: under 1 s), and
measure how far estimates made during an ITP replay were from the starts that then happened.

    python benchmarks/estimate.py [--pending N] [--repeat N] [--seed S] [--unknown FRACTION]
    python benchmarks/estimate.py --replay-days FROM,TO [--every-h H] [--runtime-noise SIGMA]

The queue is :mod:`benchmarks.decide`'s busy one (2,000 running jobs, 20 quotas, 8,000 GPUs), each
job given an expected runtime drawn from 10 min to 8 h (``--unknown``: that fraction of jobs has
none). Prints the best-of-N CPU time of :class:`~airflow_quota_provider.simulation.forecast.Forecast`,
the decisions it made, and how many jobs got an estimate.

With ``--replay-days``, the ITP trace's days [FROM, TO) are replayed under ``quota`` (priorities
high=0.2:100,normal=0.8:10 seed 1, hourly checkpoints) with expected runtimes (exact, or noisy), the
forecast is run every ``--every-h`` hours of the replay on the live state, and each estimate is
compared with the job's next start in the replay: the absolute error's median and p90, overall and
by how far ahead the estimate looked. Jobs arriving after a forecast are the main source of error.
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
from simulate import PRIORITIES, PRIORITY_SEED  # noqa: E402

from airflow_quota_provider.policy import State  # noqa: E402
from airflow_quota_provider.simulation import parse_priority_classes  # noqa: E402
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


def replay_errors(days: tuple[float, float], every_s: float, noise: float) -> None:
    from airflow_quota_provider.policy import load_quota_file
    from airflow_quota_provider.simulation import assign_priorities, load_trace, select_days
    from airflow_quota_provider.simulation.engine import QUIET_DECIDE, Simulator
    from airflow_quota_provider.simulation.forecast import estimate_starts
    from airflow_quota_provider.simulation.policies import policy_setup

    root = Path(__file__).resolve().parent.parent
    jobs = load_trace(root.parent / "shared" / "traces" / "itp_elasticflow.csv")
    jobs, _ = assign_priorities(jobs, parse_priority_classes(PRIORITIES), seed=PRIORITY_SEED)
    jobs = select_days(jobs, *days)
    config = load_quota_file(root / "examples" / "itp-quotas.yaml")
    forecasts: list[tuple[float, dict]] = []
    next_at = [min(j.submit_time_s for j in jobs) + every_s]
    cpu = [0.0]

    def decide(state, now):
        if now >= next_at[0] and len(state.pending):
            next_at[0] = now + every_s
            began = time.process_time()
            forecasts.append((now, estimate_starts(state, now)))
            cpu[0] += time.process_time() - began
        return QUIET_DECIDE(state, now)

    result = Simulator(config, policy_setup(config, "quota"), jobs, checkpoint_interval_s=3600.0, decide=decide,
                       runtime_noise=noise).run()
    holds = sorted(result.holds, key=lambda hold: hold.start)
    errors: dict[str, list[float]] = {"all": [], "< 1 h ahead": [], "1-6 h": [], "> 6 h": []}
    unknown = 0
    for at, starts in forecasts:
        actual = {}
        for hold in holds:
            if hold.start >= at:
                actual.setdefault(hold.job, hold.start)
        for job_id, estimate in starts.items():
            if estimate is None:
                unknown += 1
                continue
            if job_id not in actual:
                continue  # rejected
            error = abs(estimate - actual[job_id])
            ahead = actual[job_id] - at
            errors["all"].append(error)
            errors["< 1 h ahead" if ahead < 3600 else "1-6 h" if ahead < 6 * 3600 else "> 6 h"].append(error)
    estimates = sum(len(s) for _, s in forecasts)
    print(f"ITP days {days[0]:g}-{days[1]:g}, quota, runtimes {'exact' if noise == 0 else f'noise σ{noise:g}'}: "
          f"{len(forecasts)} forecasts of {estimates:,} waiting jobs ({unknown:,} unknown), "
          f"{cpu[0] / max(1, len(forecasts)):.2f} CPU s per forecast")
    print(f"{'actual start':<14} {'estimates':>9} {'median abs error':>17} {'p90 abs error':>14}")
    for label, values in errors.items():
        if values:
            values.sort()
            p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
            print(f"{label:<14} {len(values):>9,} {_duration(statistics.median(values)):>17} {_duration(p90):>14}")


def _duration(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replay-days", default=None, metavar="FROM,TO")
    parser.add_argument("--every-h", type=float, default=12.0)
    parser.add_argument("--runtime-noise", type=float, default=0.0, metavar="SIGMA")
    parser.add_argument("--pending", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--unknown", type=float, default=0.0, help="fraction of jobs without an expected runtime")
    args = parser.parse_args()
    if args.replay_days:
        start, end = (float(d) for d in args.replay_days.split(","))
        replay_errors((start, end), args.every_h * 3600.0, args.runtime_noise)
        return
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
