"""The jobs and hosts the policy decides over: plain, immutable data that imports nothing else of the
policy, so every module may name them (the decision state, the orders, the running set, the search).
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_NODES = 1024
"""Most hosts one job may span (a bound on input, far above any fleet's training runs)."""


@dataclass(frozen=True)
class Job:
    """One job (an Airflow task instance) placed on a quota.

    A job with ``nodes`` > 1 is a *gang*: ``nodes`` processes on as many different hosts, each with
    ``gpus // nodes`` GPUs, started together, stopped together, admitted all or nothing and preempted as
    one victim. ``gpus`` is always what the job counts against its quota: every node's GPUs (the
    decision file and the operator say ``gpus`` per host; :attr:`gpus_per_node`).
    """

    id: str
    quota: str
    gpus: int
    """GPUs in all: per node times ``nodes``."""
    priority: int
    submitted_at: float
    started_at: float | None = None
    """When it started running; set for running jobs."""
    preemptible: bool = True
    max_preemptions: int | None = None
    """Preemption retry limit; None takes the quota's."""
    preemptions: int = 0
    """How often it has been preempted so far."""
    min_runtime_s: float | None = None
    """Least run time before it may be preempted; None takes the quota's."""
    grace_period_s: float | None = None
    """How long it may take to stop once preempted (the task's own); None takes the quota's."""
    last_checkpoint_at: float | None = None
    """When a running job last saved its work in this run; None: not since it started (or unknown)."""
    expected_runtime_s: float | None = None
    """How long a run of it is expected to take from ``started_at`` (the task's history); None:
    unknown. With it, a victim expected to finish within its grace period is waited for, not
    preempted (:func:`~airflow_quota_provider.policy.preemption_policy.finishes_within_grace`)."""
    preempted_for: str | None = None
    """Set on a running job that was already chosen as a victim and is still stopping."""
    host: str | None = None
    """The host a running job's GPUs are on (a gang's node 0's); set on every running job when the
    state has hosts."""
    nodes: int = 1
    hosts: tuple[str, ...] = ()
    """A running gang's hosts, node 0's first (one per node); empty for a job on one host."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types it may run on, in its order of preference; empty: any, in the job queue's order."""
    gpu_type: str | None = None
    """The GPU type a running job runs on (a job queue with types, :mod:`.types`)."""

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    @property
    def placed_on(self) -> tuple[str, ...]:
        """The hosts a running job holds GPUs on: each holds :attr:`gpus_per_node` of them."""
        return self.hosts or (self.host,)


@dataclass(frozen=True)
class Host:
    """A machine serving one job queue with ``gpus`` GPUs. A job's GPUs are all on one host, a gang's
    node's too."""

    name: str
    gpus: int
    down: bool = False
    """A host that is lost for now: no job starts or is held there, but it still counts as one of the
    queue's hosts, so a job only it can hold waits for it to return instead of being rejected."""
    rack: str | None = None
    zone: str | None = None
    """Topology labels: a gang's nodes go to hosts of one rack if it can, else of one zone (Kueue's
    ``podset-preferred-topology``), else anywhere."""
    type: str | None = None
    """Its GPUs' type, in a job queue with types (a host holds one type)."""
