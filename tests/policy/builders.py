"""Fluent builders for policy tests: a queue, its quotas, its hosts and its jobs, in a line each."""

from __future__ import annotations

from dataclasses import replace

from airflow_quota_provider.policy import Cohort, Host, Job, PreemptionPolicy, Quota, State


def quota(name: str, capacity: int, **fields) -> Quota:
    preemption = {k: fields.pop(k) for k in ("within_quota", "reclaim", "borrow_within") if k in fields}
    return Quota(name=name, capacity=capacity, preemption=PreemptionPolicy(**preemption), **fields)


def running(job_id: str, quota_name: str, gpus: int, priority: int = 0, *, started_at: float = 0.0, **fields) -> Job:
    fields.setdefault("submitted_at", started_at)
    return Job(id=job_id, quota=quota_name, gpus=gpus, priority=priority, started_at=started_at, **fields)


def pending(job_id: str, quota_name: str, gpus: int, priority: int = 0, *, submitted_at: float = 0.0, **fields) -> Job:
    return Job(id=job_id, quota=quota_name, gpus=gpus, priority=priority, submitted_at=submitted_at, **fields)


class StateBuilder:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.quotas: list[Quota] = []
        self.running: list[Job] = []
        self.pending: list[Job] = []
        self.hosts: list[Host] | None = None
        self.cohorts: list[Cohort] = []

    def cohort(self, name: str, parent: str | None = None, capacity: int = 0, **fields) -> StateBuilder:
        """Add a cohort; quotas join one with ``cohort="..."``."""
        self.cohorts.append(Cohort(name, parent, capacity, **fields))
        return self

    def quota(self, name: str, capacity: int, **fields) -> StateBuilder:
        self.quotas.append(quota(name, capacity, **fields))
        return self

    def host(self, name: str, gpus: int, **fields) -> StateBuilder:
        """Add a host; a state with none has one implicit host of the capacity."""
        self.hosts = [*(self.hosts or []), Host(name, gpus, **fields)]
        return self

    def run(self, *args, **fields) -> StateBuilder:
        """A running job; ``host="..."`` places it when the queue has hosts."""
        self.running.append(running(*args, **fields))
        return self

    def wait(self, *args, **fields) -> StateBuilder:
        self.pending.append(pending(*args, **fields))
        return self

    def wait_gang(self, job_id: str, quota_name: str, gpus_per_node: int, nodes: int, priority: int = 0, **fields) -> StateBuilder:
        """A waiting gang of ``nodes`` nodes with ``gpus_per_node`` GPUs each (the task's ``gpus``)."""
        self.pending.append(pending(job_id, quota_name, gpus_per_node * nodes, priority, nodes=nodes, **fields))
        return self

    def run_gang(self, job_id: str, quota_name: str, gpus_per_node: int, hosts: list[str], priority: int = 0, **fields) -> StateBuilder:
        """A running gang with one node on each of ``hosts`` (node 0's first)."""
        self.running.append(running(
            job_id, quota_name, gpus_per_node * len(hosts), priority, nodes=len(hosts), host=hosts[0], hosts=tuple(hosts), **fields
        ))
        return self

    def build(self) -> State:
        hosts = None if self.hosts is None else tuple(self.hosts)
        return State(self.capacity, tuple(self.quotas), tuple(self.running), tuple(self.pending), hosts, tuple(self.cohorts))


def queue(capacity: int) -> StateBuilder:
    return StateBuilder(capacity)


def with_priority(state: State, job_id: str, priority: int) -> State:
    """The same state after a priority update of one job (running or pending)."""
    def update(jobs):
        return tuple(replace(j, priority=priority) if j.id == job_id else j for j in jobs)
    return replace(state, running=update(state.running), pending=update(state.pending))
