"""One simulation run: a workload replayed under each requested policy, checked, and summarised."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_quota_provider.policy import QuotaFile
from airflow_quota_provider.simulation.checks import run_checks
from airflow_quota_provider.simulation.engine import QUIET_DECIDE, DecideFn, SimulationResult, Simulator
from airflow_quota_provider.simulation.metrics import summarize
from airflow_quota_provider.simulation.policies import POLICIES, policy_setup
from airflow_quota_provider.simulation.workload import TraceJob

DEFAULT_CHECKPOINT_INTERVAL_S = 3600.0


@dataclass
class Run:
    report: dict[str, Any]
    results: dict[str, SimulationResult] = field(default_factory=dict)
    replay_s: dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds per policy; kept out of ``report`` so that reports are reproducible."""
    replay_cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of this process per policy (less sensitive to other load on the machine)."""


def simulate(
    quota_file: QuotaFile,
    jobs: Sequence[TraceJob],
    policies: Sequence[str] = POLICIES,
    *,
    checkpoint_interval_s: float = DEFAULT_CHECKPOINT_INTERVAL_S,
    record_timeline: bool = False,
    decide: DecideFn = QUIET_DECIDE,
    progress: Callable[[str, float, float, float], None] | None = None,
    workload: dict[str, Any] | None = None,
) -> Run:
    """Replay ``jobs`` under each policy and return the report (see :mod:`.metrics` for the figures).

    ``progress(policy, start, now, end)`` is called now and then during a replay.
    """
    start = min(j.submit_time_s for j in jobs)
    horizon = max(j.submit_time_s for j in jobs)
    report: dict[str, Any] = {
        "workload": {
            "jobs": len(jobs),
            "teams": len({j.team for j in jobs}),
            "gpu_hours": round(sum(j.duration_s * j.gpus for j in jobs) / 3600.0, 6),
            "first_submit_s": start,
            "last_submit_s": horizon,
            "checkpoint_interval_s": checkpoint_interval_s,
            **(workload or {}),
        },
        "policies": {},
    }
    run = Run(report=report)
    for name in policies:
        setup = policy_setup(quota_file, name)
        on_progress = None
        if progress is not None:
            def on_progress(now: float, _name: str = name) -> None:
                progress(_name, start, now, horizon)
        began, began_cpu = time.perf_counter(), time.process_time()
        simulator = Simulator(quota_file, setup, jobs, checkpoint_interval_s=checkpoint_interval_s, decide=decide,
                              record_timeline=record_timeline, on_progress=on_progress)
        result = simulator.run()
        run.replay_s[name] = time.perf_counter() - began
        run.replay_cpu_s[name] = time.process_time() - began_cpu
        checks = run_checks(result, setup, quota_file)
        figures = summarize(result)
        figures["checks"] = checks
        report["policies"][name] = figures
        run.results[name] = result
    return run
