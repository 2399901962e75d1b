"""Pending reasons a person can read: why a job waits, from the usage at the end of the cycle.

Reasons depend on the job only through its quota and size (and its preemption delay), so they are
built once per distinct combination: ten thousand waiting jobs cost a few hundred strings. With hosts,
a job that fits its quota but finds no host with room is told so (fragmentation), not "quota full".
"""

from __future__ import annotations

from collections.abc import Sequence

from airflow_quota_provider.policy.candidates import Candidates
from airflow_quota_provider.policy.capacity import Usage, borrowed
from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.placement import Placement
from airflow_quota_provider.policy.preemption import search_phases


class Explainer:
    def __init__(
        self, usage: Usage, quotas: dict[str, Quota], candidates: Candidates, now: float, placement: Placement | None = None
    ) -> None:
        self.usage = usage
        self.quotas = quotas
        self.candidates = candidates
        self.now = now
        self.placement = placement
        self._cache: dict[tuple, str] = {}
        self._borrowers: list[tuple[str, int, int | None]] | None = None
        self._lent: list[int] | None = None

    def drained(self, gang: Job, hosts: tuple[str, ...], until: float, after: float) -> str:
        """A gang that has waited over ``after`` seconds with no hosts for it: ``hosts`` are kept for
        it, the last expected to have room at ``until`` (``inf``: unknown)."""
        busy = [name for name in hosts if self.placement.free_now[name] < gang.gpus_per_node]
        if until == float("inf"):
            others = "nothing else starts there"
            when = ""
        else:
            others = "only jobs expected to end before then start there"
            when = f", expected in {max(0.0, until - self.now):.0f} s by their expected runtimes"
        return (
            f"waited over {after:g} s (gang_reservation_after_s) with no {gang.nodes} hosts of "
            f"{gang.gpus_per_node} free GPUs: {', '.join(hosts)} are kept for it, and it starts once their "
            f"running jobs end ({', '.join(busy)} still busy{when}); {others}"
        )

    def held(
        self, job: Job, victims: list[str], host: str | tuple[str, ...] | None = None, awaited: Sequence[Job] = ()
    ) -> str:
        """A job whose capacity (and, with hosts, GPUs on ``host``, a gang's on its hosts) is held while
        jobs stop, or finish on their own (``awaited``: expected to end before a preemption's grace
        period would, or within their quota's ``spare_finishing_within_s``, so not preempted)."""
        gang = isinstance(host, tuple)
        if victims or awaited:
            where = ""
            if gang:
                where = f"; its {job.gpus_per_node} GPUs on each of {', '.join(host)} are held for it"
            elif host is not None:
                where = f"; its {job.gpus} GPUs on {host} are held for it"
            parts = [f"waiting for preempted jobs to stop: {', '.join(victims)}"] if victims else []
            if awaited:
                parts.append(
                    f"waiting for {', '.join(self._expected_end(spared) for spared in awaited)} to finish "
                    f"on {'its' if len(awaited) == 1 else 'their'} own (spared, not preempted)"
                )
            return "; ".join(parts) + where
        if gang:
            busy = [name for name in host if self.placement.free_now[name] < job.gpus_per_node]
            return (
                f"waiting for stopping jobs to release GPUs on {', '.join(busy)}; its {job.gpus_per_node} GPUs on "
                f"each of {', '.join(host)} are held for it"
            )
        if host is not None:
            return (
                f"waiting for stopping jobs to release GPUs on {host}: needs {job.gpus}, "
                f"{max(0, self.placement.free_now[host])} free there; its capacity is held"
            )
        return (
            f"waiting for stopping jobs to release GPUs: needs {job.gpus}, "
            f"{self.usage.physically_free()} free; its capacity is held"
        )

    def _expected_end(self, job: Job) -> str:
        """``job`` and when it is expected to end: a spared job may have outlived its estimate (it is
        spared for its quota's ``spare_finishing_within_s`` more)."""
        left = job.started_at + job.expected_runtime_s - self.now
        if left >= 0:
            return f"{job.id} (expected to end in {left:.0f} s)"
        return f"{job.id} (past its expected end by {-left:.0f} s)"

    def waiting(self, job: Job, *, searched: bool) -> str:
        quota = self.quotas[job.quota]
        key = (job.quota, job.gpus, job.nodes, searched)
        reason = self._cache.get(key)
        if reason is None:
            reason = self._cache[key] = self._compose(job, quota, searched)
        if not quota.preemption_delay_s:
            return reason
        delay_left = quota.preemption_delay_s - (self.now - job.submitted_at)
        if delay_left > 0:
            reason += f"; may preempt in {delay_left:.0f} s (preemption_delay_s {quota.preemption_delay_s:g})"
        return reason

    def _compose(self, job: Job, quota: Quota, searched: bool) -> str:
        used = self.usage.used[quota.name]
        parts = []
        if job.nodes > 1 and self.placement is not None and self.usage.fits(quota.name, job.gpus, borrow=True):
            parts.append(self.placement.no_hosts(job))
        elif (
            self.placement is not None
            and self.usage.fits(quota.name, job.gpus, borrow=True)
            and self.placement.best_fit(job.gpus) is None
        ):
            parts.append(self.placement.no_room(job.gpus))
        elif used + job.gpus <= quota.capacity:
            parts.append(
                f"quota {quota.name}: {quota.capacity - used} of {quota.capacity} GPUs idle but lent, "
                f"needs {job.gpus}; {self._borrowers_text(job)}"
            )
        else:
            state = "full" if used >= quota.capacity else "in use"
            parts.append(f"quota {quota.name} {state}: {used}/{quota.capacity} GPUs, needs {job.gpus}")
            if not quota.borrows:
                parts.append(f"cannot borrow (sharing {quota.sharing})")
            elif quota.borrow_limit is not None and used + job.gpus - quota.capacity > quota.borrow_limit:
                parts.append(
                    f"borrow limit {quota.borrow_limit} reached "
                    f"({borrowed(quota, used)} borrowed, would need {used + job.gpus - quota.capacity})"
                )
            else:
                if self.usage.tree is not None:
                    parts.extend(self._cohort_full(job))
                parts.append(f"{self.usage.free_for(quota.name)} GPUs free to borrow; {self._borrowers_text(job)}")
        if searched:
            parts.append(self._no_victims(job, quota))
        return "; ".join(parts)

    def _no_victims(self, job: Job, quota: Quota) -> str:
        if not search_phases(job, quota, self.usage):
            return "preempts nobody: asks for more than its quota's capacity and borrow_within is off"
        policy = quota.preemption
        rules = f"within_quota {policy.within_quota}, reclaim {policy.reclaim}"
        if policy.borrow_within is not None:
            rules += f", borrow_within max_priority {policy.borrow_within}"
        where = "" if self.placement is None else " on one host" if job.nodes == 1 else f" on {job.nodes} hosts"
        return f"no preemptible jobs it may preempt would free {job.gpus} GPUs{where} ({rules})"

    def _cohort_full(self, job: Job) -> list[str]:
        """With cohorts: the lowest cohort above the job's quota whose share cannot hold it, with what
        its subtree owns, what its quotas use, and what it lends to which subtrees borrowing beside it."""
        usage, tree = self.usage, self.usage.tree
        node = usage.full_cohort(job.quota, job.gpus)
        if node is None:
            return []
        if self._lent is None:
            self._lent = usage.lent_by_node()[1]
        name = tree.names[node]
        members = sum(usage.used[member] for member in tree.members(node))
        text = f"cohort {name} full: {members}/{tree.total[node]} GPUs in use by its quotas"
        if self._lent[node]:
            parent = tree.parent[node]
            borrowers = [tree.names[n] for n in range(tree.root) if tree.parent[n] == parent and n != node and usage.over(n)]
            borrowers += [q for q in sorted(usage.quotas) if tree.path[q][0] == parent and usage.is_borrowing(q)]
            text += f", {self._lent[node]} lent to {', '.join(borrowers)}"
        limit = tree.borrow_limit[node]
        if limit is not None and usage.node_used[node] + job.gpus > tree.sq[node] + limit:
            text += f"; its borrow limit {limit} reached ({usage.over(node)} borrowed)"
        return [text + f", needs {job.gpus}"]

    def _borrowers_text(self, job: Job) -> str:
        """Other quotas running above their capacity: whose jobs hold what this quota lends."""
        if self._borrowers is None:
            self._borrowers = [
                (name, borrowed(quota, self.usage.used[name]), self.candidates.lowest_priority(name))
                for name, quota in sorted(self.quotas.items())
                if self.usage.is_borrowing(name)
            ]
        borrowers = [entry for entry in self._borrowers if entry[0] != job.quota]
        if not borrowers:
            return "no other quota is borrowing"
        texts = []
        for name, amount, priority in borrowers:
            if priority is None:
                texts.append(f"{name} borrows {amount} (none preemptible)")
            else:
                texts.append(f"{name} borrows {amount}, lowest preemptible priority {priority}")
        return "; ".join(texts)
