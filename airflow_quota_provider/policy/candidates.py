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
        self._start: dict[str, int] = {}

    def __iter__(self) -> Iterator[Job]:
        """Every candidate not yet taken."""
        for entries in self.by_quota.values():
            for _, job in entries:
                if job.id not in self.taken:
                    yield job

    def _untaken(self, name: str) -> Iterator[tuple[tuple, Job]]:
        """A quota's entries from the first one not taken: victims are mostly taken from the front
        (lowest priority first), so later searches skip them without rescanning."""
        entries = self.by_quota[name]
        start = self._start.get(name, 0)
        while start < len(entries) and entries[start][1].id in self.taken:
            start += 1
        self._start[name] = start
        for index in range(start, len(entries)):
            yield entries[index]

    def for_preemptor(self, preemptor: Job, quota: Quota, usage: Usage, *, borrow: bool) -> Iterator[tuple[Job, str]]:
        """Yield ``(candidate, reason)``: other quotas' jobs first, then the preemptor's own.

        Other quotas' jobs are offered only while their quota still runs above its capacity, checked
        against ``usage`` at each step, so a quota stops being a candidate as soon as the victims
        chosen so far bring it back within its capacity. Without ``borrow`` (the preemptor's quota
        ends up within its capacity) they are reclaim candidates; with it, only what
        ``borrow_within`` allows. Lists are in ascending priority, so each scan stops at the first
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
            lists = [
                self._untaken(name)
                for name, entries in self.by_quota.items()
                if name != quota.name and entries and usage.is_borrowing(name)
            ]
            for _, candidate in heapq.merge(*lists, key=_entry_key):
                if ceiling is not None and candidate.priority > ceiling:
                    break
                if candidate.id in self.taken or not usage.is_borrowing(candidate.quota):
                    continue
                yield candidate, reason
        for _, candidate in self._untaken(quota.name):
            if candidate.priority > preemptor.priority:
                break
            if candidate.id in self.taken or not within_quota_allows(policy.within_quota, preemptor, candidate):
                continue
            yield candidate, WITHIN_QUOTA


def _entry_key(entry: tuple[tuple, Job]) -> tuple:
    return entry[0]
