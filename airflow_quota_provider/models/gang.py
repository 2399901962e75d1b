"""``quota_job.gang``: where a gang's nodes run and how its starts went, as JSON in the job's row
(the executor's part for gangs is :mod:`airflow_quota_provider.executors.gangs`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from airflow_quota_provider.models.job import QuotaJob


@dataclass
class GangNode:
    """One node of a gang: its host and devices, and, for a member, its launch."""

    host: str
    devices: list[str]
    handle: str | None = None
    """A member's launch (node 0's is the job's ``handle``); None until it is started."""


@dataclass
class GangState:
    """``quota_job.gang``: a gang's nodes while it holds devices, and its failed starts."""

    nodes: list[GangNode] = field(default_factory=list)
    """Node 0's first; empty while the gang waits."""
    start_failures: int = 0
    not_before: float | None = None
    """A gang whose start failed waits until then (its backoff) before it is admitted again."""
    ending: str | None = None
    """Why the executor is ending the gang (a member's host lost, a node that did not start): once
    none of its nodes runs, it goes back to its place without using a retry."""
    start_failed: bool = False
    """``ending`` is a failed start, which counts towards the backoff and the limit."""
    told_node_failed: bool = False
    """Node 0 has been told that a member failed."""

    @classmethod
    def of(cls, job: QuotaJob) -> GangState:
        return cls.parse(job.gang)

    @classmethod
    def parse(cls, text: str | None) -> GangState:
        data = json.loads(text) if text else {}
        nodes = [GangNode(**n) for n in data.pop("nodes", [])]
        return cls(nodes=nodes, **data)

    def save(self, job: QuotaJob) -> None:
        job.gang = json.dumps(asdict(self), sort_keys=True)

    @property
    def hosts(self) -> tuple[str, ...]:
        return tuple(n.host for n in self.nodes)

    def member_handles(self) -> dict[int, str]:
        """Rank -> launch of the members started so far."""
        return {rank: n.handle for rank, n in enumerate(self.nodes) if rank and n.handle}


def gang_hosts(gang: str | None) -> tuple[str, ...]:
    """The hosts of a gang's nodes from its ``quota_job.gang`` column, node 0's first."""
    return GangState.parse(gang).hosts if gang else ()


def waits_for_backoff(gang: str | None, now: float) -> bool:
    """A gang whose last start failed waits out its backoff unseen by the policy."""
    if not gang:
        return False
    not_before = json.loads(gang).get("not_before")
    return not_before is not None and now < not_before


def forget_nodes(job: QuotaJob) -> None:
    """The job no longer holds devices: its gang's nodes go (its start failures and backoff stay)."""
    if job.gang:
        state = GangState.of(job)
        state.nodes = []
        state.save(job)
