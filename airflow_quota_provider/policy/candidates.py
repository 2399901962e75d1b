"""Collecting preemption candidates: which running jobs a waiting job may take, in search order."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Iterator

from airflow_quota_provider.policy.capacity import Usage
from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.ordering import entry_key, victim_order
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


# A candidate list is one quota's (its name) or, with hosts, one quota's on one host ((name, host)).
ListKey = str | tuple[str, str]


class Candidates:
    """The running jobs that may be preempted this cycle, per quota, each list in victim order.

    A quota's list is built (filtered, keyed, sorted) only when a search or a reason first looks at
    it: most cycles admit without preempting and never need one. With hosts, a search looks at one
    host at a time, through the quota's list split per host (the same order). Jobs chosen as victims
    earlier in the same decision are ``taken`` (:meth:`take`) and skipped afterwards.
    """

    def __init__(self, running: tuple[Job, ...], quotas: dict[str, Quota], now: float) -> None:
        self._all_running = running
        self._running: dict[str, list[Job]] | None = None
        self._quotas = quotas
        self.now = now
        self._sorted: dict[ListKey, list[tuple[tuple, Job]]] = {}
        self._split: set[str] = set()
        self._host_gpus: dict[str | None, int] | None = None
        self._totals: dict[str, tuple[list[int], list[int]]] = {}
        self.taken: set[str] = set()
        self._first: dict[ListKey, int] = {}

    def entries(self, name: str, host: str | None = None) -> list[tuple[tuple, Job]]:
        """A quota's candidates (on ``host`` only, if given) as ``(victim order key, job)``, lowest
        priority first."""
        if host is not None:
            if name not in self._split:  # split once, keeping the order
                self._split.add(name)
                for entry in self.entries(name):
                    self._sorted.setdefault((name, entry[1].host), []).append(entry)
            return self._sorted.get((name, host), [])
        entries = self._sorted.get(name)
        if entries is None:
            if self._running is None:  # grouped once, on the first search of the cycle
                self._running = {}
                for job in self._all_running:
                    self._running.setdefault(job.quota, []).append(job)
            quota, now = self._quotas[name], self.now
            entries = [(victim_order(job, now), job) for job in self._running.get(name, ()) if may_be_preempted(job, quota, now)]
            entries.sort(key=entry_key)
            self._sorted[name] = entries
        return entries

    def take(self, victim: Job) -> None:
        """``victim`` was chosen in this decision: no later search may choose it again."""
        self.taken.add(victim.id)
        if self._host_gpus is not None:
            self._host_gpus[victim.host] -= victim.gpus

    def gpus_on(self, host: str) -> int:
        """GPUs of the candidates on ``host`` not yet taken, whatever the rules: an upper bound on what
        a search on that host can free."""
        if self._host_gpus is None:
            self._host_gpus = defaultdict(int)
            for job in self._all_running:
                if job.id not in self.taken and may_be_preempted(job, self._quotas[job.quota], self.now):
                    self._host_gpus[job.host] += job.gpus
        return self._host_gpus.get(host, 0)

    def own_at_most(self, preemptor: Job, quota: Quota) -> int:
        """An upper bound on the GPUs ``within_quota`` lets ``preemptor`` take from its own quota.

        Victims taken earlier in the cycle are counted too, so this is a bound, never an underestimate.
        """
        rule = quota.preemption.within_quota
        if rule == "never":
            return 0
        totals = self._totals.get(quota.name)
        if totals is None:
            priorities, gpus = [], [0]
            for _, job in self.entries(quota.name):
                priorities.append(job.priority)
                gpus.append(gpus[-1] + job.gpus)
            totals = self._totals[quota.name] = (priorities, gpus)
        priorities, gpus = totals
        # lower_priority: strictly lower; lower_or_newer_equal_priority: equal ones may qualify too.
        count = (bisect_left if rule == "lower_priority" else bisect_right)(priorities, preemptor.priority)
        return gpus[count]

    def lowest_priority(self, name: str) -> int | None:
        """The lowest priority among a quota's candidates not yet taken, or None."""
        entries = self.entries(name)
        first = self._first_untaken(entries, name)
        return entries[first][1].priority if first < len(entries) else None

    def _next_untaken(self, entries: list[tuple[tuple, Job]], position: int) -> int:
        while position < len(entries) and entries[position][1].id in self.taken:
            position += 1
        return position

    def _first_untaken(self, entries: list[tuple[tuple, Job]], key: ListKey) -> int:
        # Victims are mostly taken from the front (lowest priority first) and never given back
        # within a cycle, so the first untaken position only moves forward.
        first = self._first[key] = self._next_untaken(entries, self._first.get(key, 0))
        return first

    def for_preemptor(
        self, preemptor: Job, quota: Quota, usage: Usage, *, borrow: bool, host: str | None = None
    ) -> Iterator[tuple[Job, str]]:
        """Yield ``(candidate, reason)``: other quotas' jobs first, then the preemptor's own; with
        ``host``, only the candidates on that host.

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
            for name in self._quotas:
                if name != quota.name and usage.is_borrowing(name):
                    entries = self.entries(name, host)
                    position = self._first_untaken(entries, name if host is None else (name, host))
                    if position < len(entries):
                        heap.append((entries[position][0], name, position))
            heapq.heapify(heap)
            while heap:
                _, name, position = heap[0]
                entries = self.entries(name, host)
                candidate = entries[position][1]
                if ceiling is not None and candidate.priority > ceiling:
                    break
                if not usage.is_borrowing(name):
                    heapq.heappop(heap)
                    continue
                following = self._next_untaken(entries, position + 1)
                if following < len(entries):
                    heapq.heapreplace(heap, (entries[following][0], name, following))
                else:
                    heapq.heappop(heap)
                yield candidate, reason
        own = self.entries(quota.name, host)
        position = self._first_untaken(own, quota.name if host is None else (quota.name, host))
        for _, candidate in own[position:]:
            if candidate.priority > preemptor.priority:
                break
            if candidate.id in self.taken or not within_quota_allows(policy.within_quota, preemptor, candidate):
                continue
            yield candidate, WITHIN_QUOTA
