"""Trace replay: what a quota file would do to a real workload, decided by the executor's own policy.

Entry points: :func:`simulate` (a workload under several policies, checked and summarised) and the
command line ``python -m airflow_quota_provider.simulation run`` (see ``docs/simulation.md``).
"""

from airflow_quota_provider.simulation.engine import CheckError, Environment, SimulationResult, Simulator
from airflow_quota_provider.simulation.policies import POLICIES, policy_setup
from airflow_quota_provider.simulation.runner import DEFAULT_CHECKPOINT_INTERVAL_S, Run, simulate
from airflow_quota_provider.simulation.workload import (
    InputError,
    TraceJob,
    assign_priorities,
    kueue_baseline,
    load_trace,
    parse_priority_classes,
    select_days,
)

__all__ = [
    "DEFAULT_CHECKPOINT_INTERVAL_S",
    "POLICIES",
    "CheckError",
    "Environment",
    "InputError",
    "Run",
    "SimulationResult",
    "Simulator",
    "TraceJob",
    "assign_priorities",
    "kueue_baseline",
    "load_trace",
    "parse_priority_classes",
    "policy_setup",
    "select_days",
    "simulate",
]
