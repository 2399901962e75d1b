"""The scheduling policy: pure Python, no Airflow import, plain data in and a decision out.

The executor, the simulator, the CLI and the REST API all call this package; it is the only place
that knows the quota arithmetic and the preemption rules (DESIGN §2). Its hot modules can also be
compiled with Cython from this same source, on request (setup.py).
"""

from airflow_quota_provider.policy.capacity import CohortUsage, QuotaUsage, summarize, summarize_cohorts
from airflow_quota_provider.policy.config import (
    MAX_QUOTAS_PER_QUEUE,
    Cohort,
    PreemptionPolicy,
    Queue,
    Quota,
    QuotaFile,
    load_quota_file,
    parse_quota_file,
    quota_to_dict,
)
from airflow_quota_provider.policy.cycle import decide, rejection_reason
from airflow_quota_provider.policy.decision import Decision, Pending, Preemption, Rejection
from airflow_quota_provider.policy.errors import PolicyError
from airflow_quota_provider.policy.jobs import Host, Job
from airflow_quota_provider.policy.state import State, parse_state
from airflow_quota_provider.policy.vocabulary import OnPreemptionLimit, PreemptionReason, Reclaim, Sharing, WithinQuota

__all__ = [
    "MAX_QUOTAS_PER_QUEUE",
    "Cohort",
    "CohortUsage",
    "Decision",
    "Host",
    "Job",
    "OnPreemptionLimit",
    "Pending",
    "PolicyError",
    "Preemption",
    "PreemptionPolicy",
    "PreemptionReason",
    "Queue",
    "Quota",
    "QuotaFile",
    "QuotaUsage",
    "Reclaim",
    "Rejection",
    "Sharing",
    "State",
    "WithinQuota",
    "decide",
    "load_quota_file",
    "parse_quota_file",
    "parse_state",
    "quota_to_dict",
    "rejection_reason",
    "summarize",
    "summarize_cohorts",
]
