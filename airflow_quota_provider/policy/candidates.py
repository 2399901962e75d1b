"""Collecting preemption candidates: which running jobs a waiting job may take, in search order."""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from airflow_quota_provider.policy.capacity import Usage
from airflow_quota_provider.policy.config import PreemptionPolicy, Quota
from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.ordering import entry_key, victim_order, victim_order_by_work
from airflow_quota_provider.policy.preemption_policy import (
    NOBODY,
    borrow_within_ceiling,
    finishes_within_grace,
    may_be_preempted,
    reclaim_ceiling,
    spares_none,
    stoppable,
    within_quota_allows,
)
from airflow_quota_provider.policy.running import Running, cumulative
from airflow_quota_provider.policy.vocabulary import PreemptionReason, WithinQuota

# A victim's reason: the rule that allowed it.

# Members read once here: on Python 3.11 each ``Enum.MEMBER`` read goes through the enum metaclass's
# ``__getattr__`` hook (~50 ns), and these are read millions of times in a replay.
_NEVER, _LOWER_PRIORITY = WithinQuota.NEVER, WithinQuota.LOWER_PRIORITY
_WITHIN_QUOTA, _BORROW_WITHIN, _RECLAIM = PreemptionReason.WITHIN_QUOTA, PreemptionReason.BORROW_WITHIN, PreemptionReason.RECLAIM


class Candidates:
    """The running jobs that may be preempted this cycle, per quota, each list in victim order.

    A quota's list is built (filtered, keyed, sorted) only when a search or a reason first looks at
    it: most cycles admit without preempting and never need one. With hosts, a search looks at one
    host at a time, through one list per host of every quota's candidates there (built on the first
    such search). Jobs chosen as victims earlier in the same decision are ``taken`` (:meth:`take`)
    and skipped afterwards.

    When some running job has an expected runtime, the lists are in :func:`victim_order_by_work`
    (least work lost first, jobs about to finish first of all) and :meth:`finishing` says which
    victims to wait for instead of preempting; otherwise in :func:`victim_order`, as without runtimes.
    """

    def __init__(self, running: Running, quotas: dict[str, Quota], now: float) -> None:
        self._running = running
        self._quotas = quotas
        self.now = now
        self._sorted: dict[str, list[tuple[tuple, Job]]] = {}
        self._more: dict[str, Iterator[list[tuple[tuple, Job]]]] = {}
        """Per quota whose list is built as far as searches reached, the rest of it, tie by tie."""
        self._own: dict[str, tuple[list[int], list[int]]] = {}
        """Per quota, its candidates' distinct priorities in order and the GPUs of those below each."""
        self.taken: set[str] = set()
        self._first: dict[str, int] = {}
        self._on_host: dict[str | None, list[tuple[tuple, Job]]] | None = None
        self._host_gpus: dict[str | None, int] = {}
        self.by_work = running.with_runtime > 0
        """Whether some running job has an expected runtime."""

    def order(self, job: Job) -> tuple:
        """``job``'s key in this decision's victim order."""
        if self.by_work:
            return victim_order_by_work(job, self.now, self.finishing(job))
        return victim_order(job, self.now)

    def finishing(self, job: Job) -> bool:
        """A victim to wait for, not preempt: it is expected to end within its grace period."""
        return self.by_work and finishes_within_grace(job, self._quotas[job.quota], self.now)

    def entries(self, name: str) -> list[tuple[tuple, Job]]:
        """A quota's candidates as ``(victim order key, job)``, lowest priority first: all of them."""
        entries = self._sorted.get(name)
        if entries is None:
            entries = self._build(name)
        more = self._more.pop(name, None)
        if more is not None:
            for ties in more:
                entries.extend(ties)
        return entries

    def _at(self, name: str, position: int) -> tuple[tuple, Job] | None:
        """Entry ``position`` of :meth:`entries`, or None past its end, building the list only as far."""
        entries = self._sorted.get(name)
        if entries is None:
            entries = self._build(name)
        while position >= len(entries):
            more = self._more.get(name)
            ties = None if more is None else next(more, None)
            if ties is None:
                self._more.pop(name, None)
                return None
            entries.extend(ties)
        return entries[position]

    def _stoppable_is_the_rule(self, quota: Quota) -> bool:
        """Whether :func:`may_be_preempted` is :func:`stoppable` for each of ``quota``'s running jobs at
        any ``now``: its rules spare none of them, and none has a ``min_runtime_s`` of its own."""
        return spares_none(quota) and not self._running.has_own_min_runtime(quota.name)

    def _build(self, name: str) -> list[tuple[tuple, Job]]:
        """Start quota ``name``'s list: whole, or (the hot case of a replay: rules that spare none of its
        stoppable jobs) empty, to be built tie by tie from an order the running jobs keep
        (:meth:`Running.by_start`, with runtimes :meth:`Running.by_saved`), so that a search that takes
        a few candidates of a quota running hundreds keys and sorts only those it reaches."""
        quota, now = self._quotas[name], self.now
        by_stopping = self._stoppable_is_the_rule(quota)  # no call with the quota and now per job
        more = None
        if by_stopping and self.by_work:
            kept = self._running.by_saved(name)
            more = None if kept is None else _by_work_ties(*kept, quota, now)
        elif by_stopping:
            kept = self._running.by_start(name)
            more = None if kept is None else _by_ties(*kept, now)
        if more is not None:
            self._more[name] = more
            entries = self._sorted[name] = []
            return entries
        jobs = self._running.of_quota(name)
        jobs = [job for job in jobs if stoppable(job)] if by_stopping else [
            job for job in jobs if may_be_preempted(job, quota, now)
        ]
        if self.by_work:  # self.order(job), without two property look-ups per job
            entries = [(victim_order_by_work(job, now, finishes_within_grace(job, quota, now)), job) for job in jobs]
        else:
            entries = [(victim_order(job, now), job) for job in jobs]
        entries.sort(key=entry_key)
        self._sorted[name] = entries
        return entries

    def take(self, victim: Job) -> None:
        """``victim`` was chosen in this decision: no later search may choose it again."""
        self.taken.add(victim.id)
        if self._on_host is not None:
            if victim.nodes == 1:
                self._host_gpus[victim.host] -= victim.gpus
            else:
                for host in victim.hosts:
                    self._host_gpus[host] -= victim.gpus_per_node

    def _host_lists(self) -> dict[str | None, list[tuple[tuple, Job]]]:
        """Per host, every quota's candidates there, in victim order (a gang on each of its hosts)."""
        if self._on_host is None:
            self._on_host = {}
            for job in self._running:
                if job.id not in self.taken and may_be_preempted(job, self._quotas[job.quota], self.now):
                    order = self.order(job)
                    per = job.gpus_per_node
                    for host in job.placed_on:
                        self._on_host.setdefault(host, []).append((order, job))
                        self._host_gpus[host] = self._host_gpus.get(host, 0) + per
            for entries in self._on_host.values():
                entries.sort(key=entry_key)
        return self._on_host

    def gpus_by_host(self) -> dict[str | None, int]:
        """:meth:`gpus_on` of every host with candidates on it (taken or not); read-only."""
        self._host_lists()
        return self._host_gpus

    def gpus_on(self, host: str) -> int:
        """GPUs of the candidates on ``host`` not yet taken, whatever the rules: an upper bound on what
        a search there can free."""
        self._host_lists()
        return self._host_gpus.get(host, 0)

    def own_at_most(self, priority: int, quota: Quota) -> int:
        """An upper bound on the GPUs ``within_quota`` lets a preemptor of ``priority`` take from its
        own quota.

        Victims taken earlier in the cycle are counted too, so this is a bound, never an underestimate.
        """
        rule = quota.preemption.within_quota
        if rule == _NEVER:
            return 0
        totals = self._own.get(quota.name)
        if totals is None:
            # The running jobs' own count when the quota's rules cannot spare one of them at this now:
            # most cycles search, and would otherwise walk a quota's jobs only for this bound.
            # (None too when one of them has a min_runtime_s of its own: :meth:`_stoppable_is_the_rule`.)
            totals = self._running.stoppable_totals(quota.name) if spares_none(quota) else None
            if totals is None:
                by_priority: dict[int, int] = {}
                for job in self._running.of_quota(quota.name):
                    if may_be_preempted(job, quota, self.now):
                        by_priority[job.priority] = by_priority.get(job.priority, 0) + job.gpus
                totals = cumulative(by_priority)
            self._own[quota.name] = totals
        priorities, gpus = totals
        # lower_priority: strictly lower; lower_or_newer_equal_priority: equal ones may qualify too.
        count = (bisect_left if rule == _LOWER_PRIORITY else bisect_right)(priorities, priority)
        return gpus[count]

    def lowest_priority(self, name: str) -> int | None:
        """The lowest priority among a quota's candidates not yet taken, or None."""
        entry = self._at(name, self._first_untaken(name))
        return None if entry is None else entry[1].priority

    def _next_untaken(self, name: str, position: int) -> int:
        while (entry := self._at(name, position)) is not None and entry[1].id in self.taken:
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
        ceiling, reason = _other_quotas_rule(policy, preemptor, borrow=borrow)
        if ceiling != NOBODY and usage.tree is not None:
            yield from self._across_tree(preemptor, quota, usage, ceiling, reason, borrow=borrow)
        elif ceiling != NOBODY:
            # A k-way merge of the borrowing quotas' lists that drops a quota as soon as it stops
            # borrowing (heapq.merge would walk through all of its remaining entries).
            heap = []
            for name in self._quotas:
                if name != quota.name and usage.is_borrowing(name):
                    position = self._first_untaken(name)
                    entry = self._at(name, position)
                    if entry is not None:
                        heap.append((entry[0], name, position))
            heapq.heapify(heap)
            while heap:
                _, name, position = heap[0]
                candidate = self._at(name, position)[1]
                if ceiling is not None and candidate.priority > ceiling:
                    break
                if not usage.is_borrowing(name):
                    heapq.heappop(heap)
                    continue
                following = self._next_untaken(name, position + 1)
                entry = self._at(name, following)
                if entry is not None:
                    heapq.heapreplace(heap, (entry[0], name, following))
                else:
                    heapq.heappop(heap)
                yield candidate, reason
        position = self._first_untaken(quota.name)
        while (entry := self._at(quota.name, position)) is not None:
            candidate = entry[1]
            position += 1
            if candidate.priority > preemptor.priority:
                break
            if candidate.id in self.taken or not within_quota_allows(policy.within_quota, preemptor, candidate):
                continue
            yield candidate, _WITHIN_QUOTA

    def _tree_ranks(
        self, preemptor: Job, quota: Quota, usage: Usage, ceiling: float | None, *, borrow: bool
    ) -> dict[str, tuple[tuple, tuple[int, ...]]]:
        """With cohorts: the other quotas whose jobs may be candidates, each with its rank and the
        cohorts between it and the preemptor's lowest common cohort (:meth:`CohortTree.relation`).

        A quota qualifies while it and every cohort between it and that common cohort run above their
        share (subtrees within their share are pruned). Its rank: the common cohort's depth (the
        farthest away first), then the subtree below it that borrows most, then that subtree's name.
        Reclaim (phase 1) also needs the preemptor's side of the common cohort to be able to end within
        its share (:meth:`_reclaim_levels`): the search then holds it to that (``within``). Kueue
        (KEP-79, ``classical/hierarchical_preemption.go``) grants the reclaim once the request fits a
        node's quota on the preemptor's path as usage stands; this per-level rule is stricter (a cohort
        never reclaims while it keeps borrowing) but counts, as Kueue's candidate walk does, the
        borrowers inside the preemptor's own side that the same search may take.
        """
        tree = usage.tree
        qualifying = []
        for name in self._quotas:
            if name == quota.name or not usage.is_borrowing(name):
                continue
            side, depth, chain = tree.relation(quota.name, name)
            if _still_borrowing(usage, name, chain):
                qualifying.append((name, side, depth, chain))
        if not borrow and qualifying:
            levels = self._reclaim_levels(preemptor, quota, usage, ceiling, qualifying)
            qualifying = [entry for entry in qualifying if levels[entry[1]]]
        ranks = {}
        for name, side, depth, chain in qualifying:
            if chain:
                top, over = tree.names[chain[-1]], usage.over(chain[-1])
            else:
                top, over = name, usage.used[name] - usage.quotas[name].capacity
            ranks[name] = ((depth, -over, top), chain)
        return ranks

    def _reclaim_levels(
        self, preemptor: Job, quota: Quota, usage: Usage, ceiling: float | None, qualifying: list[tuple]
    ) -> list[bool]:
        """Per level of the preemptor's path (its quota's position, then each cohort's), whether a
        reclaim at the cohort above that position is possible: the preemptor's side of it can end within
        its share once the preemptor is in, its own allowed victims are gone, and so are the reclaim
        candidates below that cohort on other sides than the preemptor's, as far as the levels beneath
        allow them (:meth:`TreeUsage.ends_within` with ``freed``). A nominal-0 quota in the preemptor's
        cohort that runs on the preemptor's lent GPUs is such a candidate: reclaiming it is what brings
        the cohort back within its share, and so what allows a reclaim from another cohort above.
        """
        levels = usage.ends_within(quota.name, preemptor.gpus - self.own_at_most(preemptor.priority, quota))
        if all(levels):
            return levels
        freed = [0] * len(usage.tree.path[quota.name])
        subtrees: dict[int, tuple[int, int, int]] = {}  # per cohort below a common one: side, GPUs, largest job
        for name, side, _, chain in qualifying:
            gpus, largest = self._may_free(name, usage, ceiling)
            if not chain:
                freed[side] += gpus
            else:
                _, total, most = subtrees.get(chain[-1], (side, 0, 0))
                subtrees[chain[-1]] = (side, total + gpus, max(most, largest))
        for top, (side, gpus, largest) in subtrees.items():
            # A subtree stops giving victims once it is back within its share: its excess and less than
            # one more job.
            freed[side] += min(gpus, usage.over(top) + largest - 1) if gpus else 0
        # Its own victims as they are now, not :meth:`own_at_most`'s bound (which counts victims taken
        # earlier in the cycle again). The levels are an upper bound, and the search holds each level it
        # reclaims at to its share: a level counted that cannot end within it would let the search take
        # victims there first and then fail where nearer victims alone would do, so the bound is kept
        # tight. The levels allowed before ``freed`` stay allowed.
        more = usage.ends_within(quota.name, preemptor.gpus - self._own_may_free(preemptor, quota), freed)
        return [before or after for before, after in zip(levels, more)]

    def _own_may_free(self, preemptor: Job, quota: Quota) -> int:
        """The GPUs ``within_quota`` lets ``preemptor`` take from its own quota now (victims not taken)."""
        rule = quota.preemption.within_quota
        freed = 0
        position = self._first_untaken(quota.name)
        while (entry := self._at(quota.name, position)) is not None and entry[1].priority <= preemptor.priority:
            candidate = entry[1]
            if candidate.id not in self.taken and within_quota_allows(rule, preemptor, candidate):
                freed += candidate.gpus
            position += 1
        return freed

    def _may_free(self, name: str, usage: Usage, ceiling: float | None) -> tuple[int, int]:
        """The most GPUs a reclaim can take from quota ``name``, and its largest job among them: its
        candidates up to ``ceiling`` in victim order, until one brings it back within its capacity (it
        stops being a candidate there)."""
        over = usage.used[name] - usage.quotas[name].capacity
        freed = largest = 0
        position = self._first_untaken(name)
        while freed < over and (entry := self._at(name, position)) is not None:
            candidate = entry[1]
            if ceiling is not None and candidate.priority > ceiling:
                break
            if candidate.id not in self.taken:
                freed += candidate.gpus
                largest = max(largest, candidate.gpus)
            position += 1
        return freed, largest

    def _across_tree(
        self, preemptor: Job, quota: Quota, usage: Usage, ceiling: float | None, reason: str, *, borrow: bool
    ) -> Iterator[tuple[Job, str]]:
        """:meth:`for_preemptor`'s other quotas, with cohorts: a merge of the qualifying quotas' lists
        by rank, then victim order; a quota drops out at its first job above ``ceiling`` or as soon as
        it or a cohort between it and the common cohort is back within its share."""
        ranks = self._tree_ranks(preemptor, quota, usage, ceiling, borrow=borrow)
        heap = []
        for name, (rank, _) in ranks.items():
            position = self._first_untaken(name)
            entry = self._at(name, position)
            if entry is not None:
                heap.append((rank, entry[0], name, position))
        heapq.heapify(heap)
        while heap:
            rank, _, name, position = heap[0]
            candidate = self._at(name, position)[1]
            if (ceiling is not None and candidate.priority > ceiling) or not _still_borrowing(usage, name, ranks[name][1]):
                heapq.heappop(heap)
                continue
            following = self._next_untaken(name, position + 1)
            entry = self._at(name, following)
            if entry is not None:
                heapq.heapreplace(heap, (rank, entry[0], name, following))
            else:
                heapq.heappop(heap)
            yield candidate, reason

    def on_host(self, preemptor: Job, quota: Quota, usage: Usage, host: str, *, borrow: bool) -> Iterator[tuple[Job, str]]:
        """:meth:`for_preemptor` restricted to the candidates on ``host``, in the same order.

        A host holds a few jobs, so one list of all its candidates in victim order replaces the merge
        of per-quota lists: another quota's job is offered while its quota borrows (it never starts
        again during a search, which only removes jobs) and up to the rule's priority ceiling.
        """
        entries = self._host_lists().get(host, ())
        policy = quota.preemption
        ceiling, reason = _other_quotas_rule(policy, preemptor, borrow=borrow)
        if ceiling != NOBODY and usage.tree is not None:
            ranks = self._tree_ranks(preemptor, quota, usage, ceiling, borrow=borrow)
            ranked = sorted((ranks[c.quota][0], key, c) for key, c in entries if c.quota in ranks and c.id not in self.taken)
            for _, _, candidate in ranked:
                chain = ranks[candidate.quota][1]
                if (ceiling is None or candidate.priority <= ceiling) and _still_borrowing(usage, candidate.quota, chain):
                    yield candidate, reason
        elif ceiling != NOBODY:
            for _, candidate in entries:
                if candidate.quota == quota.name or candidate.id in self.taken:
                    continue
                if ceiling is not None and candidate.priority > ceiling:
                    break
                if usage.is_borrowing(candidate.quota):
                    yield candidate, reason
        for _, candidate in entries:
            if candidate.quota != quota.name or candidate.id in self.taken:
                continue
            if candidate.priority > preemptor.priority:
                break
            if within_quota_allows(policy.within_quota, preemptor, candidate):
                yield candidate, _WITHIN_QUOTA


def _by_ties(keys: list[tuple[int, float, str]], jobs: dict[str, Job], now: float) -> Iterator[list[tuple[tuple, Job]]]:
    """Victim-order entries of the stoppable jobs in ``keys`` (:meth:`Running.by_start`), one group of
    equal priority and start at a time: the groups come in victim order, and each is sorted within."""
    i, n = 0, len(keys)
    while i < n:
        priority, started, _ = keys[i]
        j = i + 1
        while j < n and keys[j][0] == priority and keys[j][1] == started:
            j += 1
        ties = [(victim_order(job, now), job) for _, _, job_id in keys[i:j] if stoppable(job := jobs[job_id])]
        if len(ties) > 1:
            ties.sort(key=entry_key)
        if ties:
            yield ties
        i = j


def _by_work_ties(
    keys: list[tuple[int, float, str]], ends: list[tuple[float, str]], jobs: dict[str, Job], quota: Quota, now: float
) -> Iterator[list[tuple[tuple, Job]]]:
    """:func:`victim_order_by_work` entries of the stoppable jobs in ``keys`` (:meth:`Running.by_saved`),
    a group at a time: per priority, the jobs expected to finish first (found among those ending near
    ``now``), then the rest one group of equal work lost (``now`` - saved) at a time, each sorted within."""
    spare = quota.spare_finishing_within_s
    window = max(quota.grace_period_s, spare)  # no job of the quota has a grace period of its own
    # A margin for rounding: finishes_within_grace itself decides on each job ending near the window.
    margin = 1e-9 * (1.0 + abs(now) + window)
    finishing: dict[int, list[Job]] = {}
    for end, job_id in ends[bisect_left(ends, (now - spare - margin,)):]:
        if end > now + window + margin:
            break
        job = jobs[job_id]
        if stoppable(job) and finishes_within_grace(job, quota, now):
            finishing.setdefault(job.priority, []).append(job)
    spared = {job.id for group in finishing.values() for job in group}
    level = None
    i, n = 0, len(keys)
    while i < n:
        priority, negative_saved, _ = keys[i]
        if priority != level:
            level = priority
            first = finishing.get(priority)
            if first:
                yield sorted(((victim_order_by_work(job, now, True), job) for job in first), key=entry_key)
        lost = now + negative_saved  # now - saved, exactly as the key computes it
        j = i + 1
        while j < n and keys[j][0] == priority and now + keys[j][1] == lost:
            j += 1
        ties = [(victim_order_by_work(job, now, False), job) for _, _, job_id in keys[i:j]
                if job_id not in spared and stoppable(job := jobs[job_id])]
        if len(ties) > 1:
            ties.sort(key=entry_key)
        if ties:
            yield ties
        i = j


def _still_borrowing(usage: Usage, name: str, chain: tuple[int, ...]) -> bool:
    """Quota ``name`` and each cohort of ``chain`` above it run above their share: none of them is a
    subtree within its share, which a reclaim never touches."""
    return usage.is_borrowing(name) and all(usage.node_borrowing(node) for node in chain)


def _other_quotas_rule(policy: PreemptionPolicy, preemptor: Job, *, borrow: bool) -> tuple[float | None, str]:
    """The priority ceiling for other quotas' jobs and the rule that allows them: reclaim when the
    preemptor's quota ends up within its capacity, ``borrow_within`` when it keeps borrowing."""
    if borrow:
        return borrow_within_ceiling(policy.borrow_within, preemptor.priority), _BORROW_WITHIN
    return reclaim_ceiling(policy.reclaim, preemptor.priority), _RECLAIM
