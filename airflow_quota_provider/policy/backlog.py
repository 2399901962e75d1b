"""The waiting jobs of one job queue: per quota, in queue order, with the figures a cycle needs to
skip a whole quota at once (its smallest and largest request, its highest priority) or the jobs of
a quota too large to start (:meth:`Backlog.next_smaller`).

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

from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.ordering import queue_order


Entry = tuple[tuple, "Job"]
"""``(queue_order(job), job)``; the key ends on the job id, so entries never compare jobs."""


class Backlog:
    """Waiting jobs by quota, each quota's list in queue order (priority, then FIFO)."""

    __slots__ = ("_entries", "_jobs", "_sizes", "_priorities", "_span", "_gangs", "_singles", "_types", "asking_types")

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self._entries: dict[str, list[Entry]] = {}
        self._jobs: dict[str, Job] = {}
        self._sizes: dict[str, dict[int, list[tuple]]] = {}
        """Per quota and number of GPUs, the keys of the jobs asking for that many, in queue order."""
        self._priorities: dict[str, dict[int, int]] = {}
        self._span: dict[str, tuple[int, int]] = {}
        """:meth:`smallest` and :meth:`largest` per quota, until its jobs change (a cycle asks them for
        every quota it skips)."""
        self._gangs: dict[str, dict[tuple[int, int], int]] = {}
        """Per quota with some, how many of its gangs ask for each ``(GPUs per node, nodes)``."""
        self._singles: dict[str, dict[int, int]] = {}
        """Per quota with gangs waiting, how many of its other jobs ask for each number of GPUs."""
        self._types: dict[str, Backlog] | None = None
        """Per GPU type, the jobs that ask for that type only (:meth:`of_type`), from the first call on."""
        self.asking_types = 0
        """How many ask for GPU types (a job queue without types rejects them)."""
        self._fill((queue_order(job), job) for job in jobs)
        for entries in self._entries.values():
            entries.sort()
        for sizes in self._sizes.values():
            for keys in sizes.values():
                keys.sort()

    def _fill(self, entries: Iterable[Entry]) -> None:
        for key, job in entries:
            self._count(job)
            self._entries.setdefault(job.quota, []).append((key, job))
            self._sizes.setdefault(job.quota, {}).setdefault(job.gpus, []).append(key)

    @classmethod
    def of(cls, pending: Iterable[Job]) -> Backlog:
        return pending if isinstance(pending, Backlog) else cls(pending)

    @classmethod
    def in_order(cls, entries: Iterable[Entry]) -> Backlog:
        """The jobs of ``entries``, given in queue order with their keys (a typed job queue's share
        of one it has ordered already): neither keyed nor sorted again."""
        backlog = cls()
        backlog._fill(entries)
        return backlog

    def _count(self, job: Job) -> None:
        if job.id in self._jobs:
            raise ValueError(f"job {job.id!r} is already waiting")
        self._jobs[job.id] = job
        if job.gpu_types:
            self.asking_types += 1
        by_priority = self._priorities.setdefault(job.quota, {})
        by_priority[job.priority] = by_priority.get(job.priority, 0) + 1
        self._span.pop(job.quota, None)
        if job.nodes > 1:
            shapes = self._gangs.get(job.quota)
            if shapes is None:  # the quota's first gang: count its other jobs by size from now on
                shapes = self._gangs[job.quota] = {}
                sizes = self._singles[job.quota] = {}
                for _, other in self._entries.get(job.quota, ()):
                    if other.nodes == 1:
                        sizes[other.gpus] = sizes.get(other.gpus, 0) + 1
            shape = (job.gpus_per_node, job.nodes)
            shapes[shape] = shapes.get(shape, 0) + 1
        elif job.quota in self._singles:
            sizes = self._singles[job.quota]
            sizes[job.gpus] = sizes.get(job.gpus, 0) + 1

    def add(self, job: Job) -> None:
        self._count(job)
        key = queue_order(job)
        insort(self._entries.setdefault(job.quota, []), (key, job))
        insort(self._sizes.setdefault(job.quota, {}).setdefault(job.gpus, []), key)
        if self._types is not None and len(job.gpu_types) == 1:
            self.of_type(job.gpu_types[0]).add(job)

    def remove(self, job_id: str) -> Job:
        job = self._jobs.pop(job_id)
        if job.gpu_types:
            self.asking_types -= 1
        self._span.pop(job.quota, None)
        key = queue_order(job)
        entries = self._entries[job.quota]
        del entries[bisect_left(entries, (key,))]
        sizes = self._sizes[job.quota]
        keys = sizes[job.gpus]
        del keys[bisect_left(keys, key)]
        if not keys:
            del sizes[job.gpus]
        by_priority = self._priorities[job.quota]
        by_priority[job.priority] -= 1
        if not by_priority[job.priority]:
            del by_priority[job.priority]
        if job.nodes > 1:
            shapes = self._gangs[job.quota]
            shape = (job.gpus_per_node, job.nodes)
            shapes[shape] -= 1
            if not shapes[shape]:
                del shapes[shape]
                if not shapes:
                    del self._gangs[job.quota], self._singles[job.quota]
        elif job.quota in self._singles:
            sizes = self._singles[job.quota]
            sizes[job.gpus] -= 1
            if not sizes[job.gpus]:
                del sizes[job.gpus]
        if not entries:
            del self._entries[job.quota], self._sizes[job.quota], self._priorities[job.quota]
        if self._types is not None and len(job.gpu_types) == 1:
            self._types[job.gpu_types[0]].remove(job_id)
        return job

    def of_type(self, gpu_type: str) -> Backlog:
        """The jobs that ask for ``gpu_type`` and no other (a job queue with GPU types decides each
        type on its own, :mod:`.types`), kept up to date with this object from the first call on, so
        that a caller that keeps it between cycles (the simulator) does not sort them again each cycle."""
        if self._types is None:
            self._types = {}
            for job in self._jobs.values():
                if len(job.gpu_types) == 1:
                    self._types.setdefault(job.gpu_types[0], Backlog()).add(job)
        by_type = self._types.get(gpu_type)
        if by_type is None:
            by_type = self._types[gpu_type] = Backlog()
        return by_type

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
        for _, job in self.entries_in_queue_order():
            yield job

    def entries_in_queue_order(self) -> Iterator[Entry]:
        """Every waiting job as its :data:`Entry`, across quotas, in queue order."""
        return heapq.merge(*self._entries.values())

    # Distinct sizes and priorities are few, so these are cheap however long the queue is.
    # Asked of every quota at every cycle: read from _span without a call when known.
    def smallest(self, quota: str) -> int:
        return (self._span.get(quota) or self._bounds(quota))[0]

    def largest(self, quota: str) -> int:
        return (self._span.get(quota) or self._bounds(quota))[1]

    def _bounds(self, quota: str) -> tuple[int, int]:
        sizes = self._sizes[quota]
        span = self._span[quota] = (min(sizes), max(sizes))
        return span

    def next_smaller(self, quota: str, index: int, gpus: float) -> int:
        """The position in :meth:`entries` of ``quota``'s first job from ``index`` on that asks for
        fewer than ``gpus`` GPUs; the length of its entries when there is none."""
        entries = self.entries(quota)
        if index >= len(entries):
            return index
        key = entries[index][0]
        first = None
        for size, keys in self._sizes[quota].items():
            if size < gpus:
                at = bisect_left(keys, key)
                if at < len(keys) and (first is None or keys[at] < first):
                    first = keys[at]
        return len(entries) if first is None else bisect_left(entries, (first,))

    def has_gangs(self, quota: str) -> bool:
        """Whether some waiting job of ``quota`` spans hosts: sizes then say nothing of fitting hosts."""
        return quota in self._gangs

    def gang_shapes(self, quota: str) -> list[tuple[int, int]]:
        """The ``(GPUs per node, nodes)`` of ``quota``'s waiting gangs (a few distinct ones)."""
        return list(self._gangs.get(quota, ()))

    def largest_single(self, quota: str) -> int:
        """The most GPUs one of ``quota``'s waiting jobs on one host asks for (0: none), with gangs waiting."""
        return max(self._singles[quota], default=0)

    def highest_priority(self, quota: str) -> int:
        return max(self._priorities[quota])
