"""What one decision cycle says: who starts, who is preempted, why the others wait."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Preemption:
    """Stop ``id`` so that ``for_`` can run: SIGTERM, the grace period, then requeue (or fail)."""

    id: str
    for_: str
    reason: str
    """``within_quota`` | ``reclaim`` | ``borrow_within``: the rule that allowed it."""
    quota: str
    fail: bool = False
    """True when this preemption is past the job's ``max_preemptions``: fail it instead of requeueing."""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        result = {"id": self.id, "for": self.for_, "reason": self.reason, "quota": self.quota, "fail": self.fail}
        if self.message:
            result["message"] = self.message
        return result


@dataclass(slots=True)
class Pending:
    """A waiting job: its place in its quota's queue (1 = next) and why it is not running."""

    id: str
    position: int
    reason: str
    awaits: list[str] = field(default_factory=list)
    """Running jobs it waits for instead of preempting them: expected to finish within their grace
    period. Their capacity is held for it as for its victims'."""

    def to_dict(self) -> dict[str, Any]:
        result = {"id": self.id, "position": self.position, "reason": self.reason}
        if self.awaits:
            result["awaits"] = list(self.awaits)
        return result


@dataclass(slots=True)
class Rejection:
    """A job that can never run under this configuration; its task should fail with ``reason``."""

    id: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "reason": self.reason}


@dataclass
class Decision:
    admit: list[str] = field(default_factory=list)
    """Ids of the jobs that start now."""
    preempt: list[Preemption] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)
    reject: list[Rejection] = field(default_factory=list)
    hosts: dict[str, str | list[str]] = field(default_factory=dict)
    """Admitted job id -> the host it starts on (a gang's: its hosts, node 0's first); empty when the
    state had no hosts."""
    placed: bool = False
    """True when the state had hosts: ``to_dict`` then says where each admitted job starts."""
    types: dict[str, str] = field(default_factory=dict)
    """Admitted job id -> the GPU type it starts on; empty for a job queue without types."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "admit": [self._admission(i) for i in self.admit] if self.placed or self.types else list(self.admit),
            "preempt": [p.to_dict() for p in self.preempt],
            "pending": [p.to_dict() for p in self.pending],
            "reject": [r.to_dict() for r in self.reject],
        }


    def _admission(self, job_id: str) -> dict[str, Any]:
        """An admission with hosts (a gang's: every node's, ``host`` its node 0's) or a GPU type."""
        out: dict[str, Any] = {"id": job_id}
        where = self.hosts.get(job_id)
        if isinstance(where, str):
            out["host"] = where
        elif where is not None:
            out.update(host=where[0], hosts=list(where))
        if job_id in self.types:
            out["gpu_type"] = self.types[job_id]
        return out
