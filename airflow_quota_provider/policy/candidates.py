"""Collecting preemption candidates: which running jobs a waiting job may take, in search order."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from airflow_quota_provider.policy.capacity import Usage
from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.ordering import victim_order
from airflow_quota_provider.policy.preemption_policy import (
    NOBODY,
    borrow_within_ceiling,
    may_be_preempted,
    reclaim_ceiling,
    within_quota_allows,
)
from airflow_quota_provider.policy.state import Job

# A victim's reason: the rule that allowed it.
WITHIN_QUOTA = "within_quota"
RECLAIM = "reclaim"
BORROW_WITHIN = "borrow_within"


class Candidates:
    """The running jobs that may be preempted this cycle, per quota, each list in victim order.

    Built once per decision; jobs chosen as victims earlier in the same decision are ``taken`` and
    skipped afterwards.
    """

    def __init__(self, running: tuple[Job, ...], quotas: dict[str, Quota], now: float) -> None:
        by_quota: dict[str, list[tuple[tuple, Job]]] = {name: [] for name in quotas}
        for job in running:
            if may_be_preempted(job, quotas[job.quota], now):
                by_quota[job.quota].append((victim_order(job, now), job))
        for entries in by_quota.values():
            entries.sort(key=lambda entry: entry[0])
        self.by_quota = by_quota
        self.taken: set[str] = set()
        self._first: dict[str, int] = {}

    def __iter__(self) -> Iterator[Job]:
        """Every candidate not yet taken."""
        for entries in self.by_quota.values():
            for _, job in entries:
                if job.id not in self.taken:
                    yield job

    def _next_untaken(self, name: str, position: int) -> int:
        entries = self.by_quota[name]
        while position < len(entries) and entries[position][1].id in self.taken:
            position += 1
        return position

    def _first_untaken(self, name: str) -> int:
        # Victims are mostly taken from the front (lowest priority first) and never given back
        # within a cycle, so the first untaken position only moves forward.
        first = self._first[name] = self._next_untaken(name, self._first.get(name, 0))
        return first

    def for_preemptor(self, preemptor: Job, quota: Quota, usage: Usage, *, borrow: bool) -> Iterator[tuple[Job, str]]:
        """Yield ``(candidate, reason)``: other quotas' jobs first, then the preemptor's own.

        Other quotas' jobs are offered only while their quota still runs above its capacity, checked
        against ``usage`` at each step, so a quota stops being a candidate as soon as the victims
        chosen so far bring it back within its capacity. Without ``borrow`` (the preemptor's quota
        ends up within its capacity) they are reclaim candidates; with it, only what
        ``borrow_within`` allows. Lists are in ascending priority, so a scan stops at the first
        candidate above the highest priority its rule allows.
        """
        policy = quota.preemption
        if borrow:
            ceiling = borrow_within_ceiling(policy.borrow_within, preemptor)
            reason = BORROW_WITHIN
        else:
            ceiling = reclaim_ceiling(policy.reclaim, preemptor)
            reason = RECLAIM
        if ceiling != NOBODY:
            # A k-way merge of the borrowing quotas' lists that drops a quota as soon as it stops
            # borrowing (heapq.merge would walk through all of its remaining entries).
            heap = []
            for name, entries in self.by_quota.items():
                if name != quota.name and usage.is_borrowing(name):
                    position = self._first_untaken(name)
                    if position < len(entries):
                        heap.append((entries[position][0], name, position))
            heapq.heapify(heap)
            while heap:
                _, name, position = heap[0]
                entries = self.by_quota[name]
                candidate = entries[position][1]
                if ceiling is not None and candidate.priority > ceiling:
                    break
                if not usage.is_borrowing(name):
                    heapq.heappop(heap)
                    continue
                following = self._next_untaken(name, position + 1)
                if following < len(entries):
                    heapq.heapreplace(heap, (entries[following][0], name, following))
                else:
                    heapq.heappop(heap)
                yield candidate, reason
        own = self.by_quota.get(quota.name, ())
        position = self._first_untaken(quota.name) if own else 0
        for _, candidate in own[position:]:
            if candidate.priority > preemptor.priority:
                break
            if candidate.id in self.taken or not within_quota_allows(policy.within_quota, preemptor, candidate):
                continue
            yield candidate, WITHIN_QUOTA
