"""One simulation run: a workload replayed under each requested policy, checked, and summarised."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_quota_provider.policy import Host, QuotaFile
from airflow_quota_provider.policy.accounting import collector_paused
from airflow_quota_provider.simulation.checks import run_checks
from airflow_quota_provider.simulation.engine import QUIET_DECIDE, DecideFn, SimulationResult, Simulator
from airflow_quota_provider.simulation.metrics import summarize
from airflow_quota_provider.simulation.policies import POLICIES, policy_setup
from airflow_quota_provider.simulation.workload import InputError, TraceJob

DEFAULT_CHECKPOINT_INTERVAL_S = 3600.0


@dataclass
class Run:
    report: dict[str, Any]
    results: dict[str, SimulationResult] = field(default_factory=dict)
    replay_s: dict[str, float] = field(default_factory=dict)
    """Wall-clock seconds per policy; kept out of ``report`` so that reports are reproducible."""
    replay_cpu_s: dict[str, float] = field(default_factory=dict)
    """CPU seconds of this process per policy (less sensitive to other load on the machine)."""


def uniform_fleet(
    quota_file: QuotaFile, hosts_per_queue: int | None, gpus_per_host: int | None
) -> dict[str, tuple[Host, ...]] | None:
    """``hosts_per_queue`` hosts of ``gpus_per_host`` GPUs for each job queue, named ``<queue>-<n>``;
    None when neither is given (one implicit host per queue). Each queue's capacity must be the
    hosts' GPUs, so that a replay with hosts differs from one without only by where jobs fit."""
    if hosts_per_queue is None and gpus_per_host is None:
        return None
    if hosts_per_queue is None or gpus_per_host is None:
        missing, given = ("--hosts-per-queue", "--gpus-per-host") if hosts_per_queue is None else (
            "--gpus-per-host", "--hosts-per-queue")
        raise InputError(missing, f"is required with {given} (give both, or neither for one implicit host per job queue)")
    for flag, value in (("--hosts-per-queue", hosts_per_queue), ("--gpus-per-host", gpus_per_host)):
        if value < 1:
            raise InputError(flag, f"{value} must be at least 1")
    fleet = {}
    width = len(str(hosts_per_queue))
    for queue in quota_file.queues:
        if hosts_per_queue * gpus_per_host != queue.capacity:
            raise InputError("--hosts-per-queue", f"{hosts_per_queue} hosts of {gpus_per_host} GPUs are "
                             f"{hosts_per_queue * gpus_per_host} GPUs; job queue {queue.name} has {queue.capacity} "
                             f"(they must be equal)")
        # A queue with GPU types: each type's capacity is whole hosts of its type, in the queue's order.
        kinds: list[str | None] = [None] * hosts_per_queue
        if queue.types:
            kinds = []
            for gpu_type in queue.types:
                if gpu_type.capacity % gpus_per_host:
                    raise InputError("--gpus-per-host", f"GPU type {gpu_type.name} of job queue {queue.name} has "
                                     f"{gpu_type.capacity} GPUs, not whole hosts of {gpus_per_host}")
                kinds += [gpu_type.name] * (gpu_type.capacity // gpus_per_host)
        fleet[queue.name] = tuple(Host(f"{queue.name}-{n:0{width}d}", gpus_per_host, type=kind)
                                  for n, kind in enumerate(kinds, start=1))
    return fleet


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
    hosts_per_queue: int | None = None,
    gpus_per_host: int | None = None,
    runtime_noise: float | None = None,
    runtime_seed: int = 0,
) -> Run:
    """Replay ``jobs`` under each policy and return the report (see :mod:`.metrics` for the figures).

    ``progress(policy, start, now, end)`` is called now and then during a replay. With
    ``hosts_per_queue`` and ``gpus_per_host`` (both or neither, see :func:`uniform_fleet`), every
    policy places jobs on the same hosts, and jobs larger than a host are rejected. With
    ``runtime_noise`` the policy knows each job's expected runtime (exact at 0; see :mod:`.engine`).
    """
    fleet = uniform_fleet(quota_file, hosts_per_queue, gpus_per_host)
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
            **({} if runtime_noise is None else {"runtime_noise": runtime_noise, "runtime_seed": runtime_seed}),
            **(workload or {}),
        },
        "policies": {},
    }
    if fleet is not None:
        report["workload"].update(hosts_per_queue=hosts_per_queue, gpus_per_host=gpus_per_host)
    run = Run(report=report)
    for name in policies:
        setup = policy_setup(quota_file, name)
        on_progress = None
        if progress is not None:
            def on_progress(now: float, _name: str = name) -> None:
                progress(_name, start, now, horizon)
        began, began_cpu = time.perf_counter(), time.process_time()
        with collector_paused():  # also while the replay's jobs are made: 0.2 s of collections for the ITP trace
            simulator = Simulator(quota_file, setup, jobs, checkpoint_interval_s=checkpoint_interval_s, decide=decide,
                                  record_timeline=record_timeline, on_progress=on_progress, hosts=fleet,
                                  runtime_noise=runtime_noise, runtime_seed=runtime_seed)
            result = simulator.run()
        run.replay_s[name] = time.perf_counter() - began
        run.replay_cpu_s[name] = time.process_time() - began_cpu
        checks = run_checks(result, setup, quota_file)
        figures = summarize(result)
        figures["checks"] = checks
        report["policies"][name] = figures
        run.results[name] = result
    return run
