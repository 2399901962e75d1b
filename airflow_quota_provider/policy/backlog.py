"""The waiting jobs of one job queue: per quota, in queue order, with the figures a cycle needs to
skip a whole quota at once (its smallest and largest request, its highest priority).

:func:`~airflow_quota_provider.policy.decide` builds one from ``State.pending`` when given a plain
list of jobs. A caller that decides often over a long backlog (the simulator) keeps one up to date
between cycles instead (:meth:`Backlog.add`, :meth:`Backlog.remove`) and passes it as
``State.pending``: a cycle then costs what it starts and preempts, not what waits. ``decide`` never
changes it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

from airflow_quota_provider.policy.ordering import queue_order

if TYPE_CHECKING:
    from airflow_quota_provider.policy.state import Job

Entry = tuple[tuple, "Job"]
"""``(queue_order(job), job)``; the key ends on the job id, so entries never compare jobs."""


class Backlog:
    """Waiting jobs by quota, each quota's list in queue order (priority, then FIFO)."""

    __slots__ = ("_entries", "_jobs", "_gpus", "_priorities")

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self._entries: dict[str, list[Entry]] = {}
        self._jobs: dict[str, Job] = {}
        self._gpus: dict[str, dict[int, int]] = {}
        self._priorities: dict[str, dict[int, int]] = {}
        for job in jobs:
            self._count(job)
            self._entries.setdefault(job.quota, []).append((queue_order(job), job))
        for entries in self._entries.values():
            entries.sort()

    @classmethod
    def of(cls, pending: Iterable[Job]) -> Backlog:
        return pending if isinstance(pending, Backlog) else cls(pending)

    def _count(self, job: Job) -> None:
        if job.id in self._jobs:
            raise ValueError(f"job {job.id!r} is already waiting")
        self._jobs[job.id] = job
        for counts, value in ((self._gpus, job.gpus), (self._priorities, job.priority)):
            by_value = counts.setdefault(job.quota, {})
            by_value[value] = by_value.get(value, 0) + 1

    def add(self, job: Job) -> None:
        self._count(job)
        insort(self._entries.setdefault(job.quota, []), (queue_order(job), job))

    def remove(self, job_id: str) -> Job:
        job = self._jobs.pop(job_id)
        entries = self._entries[job.quota]
        del entries[bisect_left(entries, (queue_order(job),))]
        for counts, value in ((self._gpus, job.gpus), (self._priorities, job.priority)):
            by_value = counts[job.quota]
            by_value[value] -= 1
            if not by_value[value]:
                del by_value[value]
        if not entries:
            del self._entries[job.quota], self._gpus[job.quota], self._priorities[job.quota]
        return job

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._jobs

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def quotas(self) -> list[str]:
        """The quotas with waiting jobs."""
        return list(self._entries)

    def entries(self, quota: str) -> list[Entry]:
        """A quota's waiting jobs as :data:`Entry`, in queue order; empty for a quota with none."""
        return self._entries.get(quota, [])

    def in_queue_order(self) -> Iterator[Job]:
        """Every waiting job, across quotas, in queue order."""
        for _, job in heapq.merge(*self._entries.values()):
            yield job

    # Distinct sizes and priorities are few, so these are cheap however long the queue is.
    def smallest(self, quota: str) -> int:
        return min(self._gpus[quota])

    def largest(self, quota: str) -> int:
        return max(self._gpus[quota])

    def highest_priority(self, quota: str) -> int:
        return max(self._priorities[quota])
