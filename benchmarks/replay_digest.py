"""Digests of what the trace replays decide: proof that a change to the simulator or the policy changed nothing.

    python benchmarks/replay_digest.py [--trace ../shared/traces/itp_elasticflow.csv]
                                       [--config examples/itp-quotas.yaml] [--count N] [--jobs 2]

Replays the trace (its first ``--count`` jobs in submission order; all by default) as
``simulate.py`` does: ``quota``, ``static``, ``fifo``, ``quota`` with exact and with σ 0.5 runtimes,
and ``quota`` on 150 hosts of 8 GPUs per job queue. Prints per replay the sha256 of every decision
that acts (time, admissions with their hosts, preemptions, rejections), of every job's outcome
(status, first start, end, wait, preemptions, lost work) and of the report's figures. Run it before
and after a change: the lines must be identical. The full trace takes about a minute per replay.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from simulate import PRIORITIES, PRIORITY_SEED, ROOT

from airflow_quota_provider.policy import decide, load_quota_file
from airflow_quota_provider.simulation import assign_priorities, load_trace, parse_priority_classes, simulate

REPLAYS = {
    "quota": ("quota", None, None),
    "static": ("static", None, None),
    "fifo": ("fifo", None, None),
    "quota+runtimes": ("quota", 0.0, None),
    "quota+runtimes σ0.5": ("quota", 0.5, None),
    "quota 150x8 hosts": ("quota", None, (150, 8)),
}
"""Label: (policy, runtime noise, (hosts per job queue, GPUs per host))."""


def digests(trace: Path, config: Path, count: int | None, label: str) -> str:
    """One replay's line: its label, decisions made, and the three digests."""
    policy, noise, hosts = REPLAYS[label]
    jobs, _ = assign_priorities(load_trace(trace), parse_priority_classes(PRIORITIES), seed=PRIORITY_SEED)
    jobs = sorted(jobs, key=lambda job: job.submit_time_s)[:count]
    acting = hashlib.sha256()

    def observed(state, now):
        decision = decide(state, now, explain=False)
        if decision.admit or decision.preempt or decision.reject:
            acting.update(repr((now, decision.admit, sorted(decision.hosts.items()), decision.preempt,
                                decision.reject)).encode())
        return decision

    hosts_per_queue, gpus_per_host = hosts or (None, None)
    run = simulate(load_quota_file(config), jobs, [policy], decide=observed, runtime_noise=noise,
                   hosts_per_queue=hosts_per_queue, gpus_per_host=gpus_per_host)
    outcomes = hashlib.sha256(repr([(j.trace.id, j.status, j.first_start, j.end, j.wait, j.preemptions, j.lost)
                                    for j in run.results[policy].jobs]).encode())
    figures = hashlib.sha256(json.dumps(run.report, sort_keys=True).encode())
    return (f"{label:<20} {run.report['policies'][policy]['decisions']:>8} decisions  decisions {acting.hexdigest()[:16]}"
            f"  outcomes {outcomes.hexdigest()[:16]}  figures {figures.hexdigest()[:16]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", type=Path, default=ROOT.parent / "shared" / "traces" / "itp_elasticflow.csv")
    parser.add_argument("--config", type=Path, default=ROOT / "examples" / "itp-quotas.yaml")
    parser.add_argument("--count", type=int, default=None, help="replay only the first N jobs in submission order")
    parser.add_argument("--jobs", type=int, default=2, help="replays at once, one process each")
    args = parser.parse_args()
    if not args.trace.is_file():
        parser.error(f"--trace: {args.trace} not found")
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        lines = pool.map(digests, *zip(*[(args.trace, args.config, args.count, label) for label in REPLAYS]))
        for line in lines:
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
