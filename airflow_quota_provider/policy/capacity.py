"""Quota arithmetic: the one place that knows what "fits", "borrowed" and "lent" mean.

A job queue's GPUs are the quotas' capacities plus a common pool (what the capacities leave
unassigned). A quota's *idle* capacity is what its own jobs do not use; the part of it others may use
is its *lendable* capacity (none for ``reserve``, at most ``lend_limit`` otherwise, and never the
private rest). Quotas that borrow (``lend_and_borrow``) may run above their capacity, up to
``borrow_limit``, on the common pool and on what others lend. The queue is *balanced* when

    sum of borrowed GPUs <= common pool + sum of lendable GPUs,

and every quota is within its own capacity or within its borrow limit. A balanced queue never holds
more GPUs than it has (the sum of usage is then at most the sum of capacities plus the pool), so the
balance is the whole admission rule; a reclaim is exactly a change that would unbalance it.

Two usages are tracked. *Logical* usage is what the policy has assigned: running jobs, minus victims
already told to stop, plus jobs holding capacity while their victims stop. *Physical* usage is the
GPUs that processes hold right now, victims included. A job may start only when both allow it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.state import State


def lendable(quota: Quota, used: int) -> int:
    """GPUs of ``quota``'s capacity that other quotas may use while it uses ``used`` of them."""
    if not quota.lends:
        return 0
    floor = used if used > quota.private else quota.private
    return quota.capacity - floor if floor < quota.capacity else 0


def borrowed(quota: Quota, used: int) -> int:
    return used - quota.capacity if used > quota.capacity else 0


def ever_fits(quota: Quota, quotas: Iterable[Quota], capacity: int) -> int:
    """The most GPUs ``quota`` can ever hold: its capacity, plus what it may borrow when all else is idle."""
    if not quota.borrows:
        return quota.capacity
    others_private = sum(q.private for q in quotas if q.name != quota.name)
    most = capacity - others_private
    if quota.borrow_limit is not None:
        most = min(most, quota.capacity + quota.borrow_limit)
    return most


class Usage:
    """Mutable usage of one job queue during one decision; every check is O(1)."""

    def __init__(self, capacity: int, quotas: Iterable[Quota]) -> None:
        self.capacity = capacity
        self.quotas = {q.name: q for q in quotas}
        self.used = dict.fromkeys(self.quotas, 0)
        self.physical = 0
        self.common = capacity - sum(q.capacity for q in self.quotas.values())
        self.supply = self.common + sum(lendable(q, 0) for q in self.quotas.values())
        self.borrowed_total = 0

    def _set(self, name: str, new: int) -> None:
        quota = self.quotas[name]
        old = self.used[name]
        self.supply += lendable(quota, new) - lendable(quota, old)
        self.borrowed_total += borrowed(quota, new) - borrowed(quota, old)
        self.used[name] = new

    def add(self, name: str, gpus: int) -> None:
        self._set(name, self.used[name] + gpus)

    def remove(self, name: str, gpus: int) -> None:
        self._set(name, self.used[name] - gpus)

    def fits(self, name: str, gpus: int, *, borrow: bool) -> bool:
        """Whether ``gpus`` more for quota ``name`` keep the queue balanced (ignoring physical usage).

        With ``borrow=False`` the quota must stay within its own capacity.
        """
        quota = self.quotas[name]
        old = self.used[name]
        new = old + gpus
        if new > quota.capacity:
            if not (borrow and quota.borrows):
                return False
            if quota.borrow_limit is not None and new - quota.capacity > quota.borrow_limit:
                return False
        supply = self.supply + lendable(quota, new) - lendable(quota, old)
        borrowed_total = self.borrowed_total + borrowed(quota, new) - borrowed(quota, old)
        return borrowed_total <= supply

    def physically_free(self) -> int:
        return self.capacity - self.physical

    def is_borrowing(self, name: str) -> bool:
        return self.used[name] > self.quotas[name].capacity

    def share(self, name: str) -> float:
        """Fair-sharing position of a borrower: borrowed GPUs per unit of weight (lowest goes first)."""
        quota = self.quotas[name]
        return borrowed(quota, self.used[name]) / quota.weight

    def free_for(self, name: str) -> int:
        """The most GPUs ``name`` could start now without preemption (borrowing where allowed)."""
        low, high = 0, self.physically_free()
        while low < high:  # fits() is monotone in gpus
            middle = (low + high + 1) // 2
            if self.fits(name, middle, borrow=True):
                low = middle
            else:
                high = middle - 1
        return low

    def lent(self) -> dict[str, int]:
        """GPUs of each quota's capacity in use by borrowers.

        Borrowers draw on the common pool first, then on the lenders in proportion to what each
        lends (largest remainder, ties by name), so the figures add up to the borrowed total.
        """
        from_lenders = max(0, self.borrowed_total - self.common)
        offers = {n: lendable(q, self.used[n]) for n, q in self.quotas.items()}
        total = sum(offers.values())
        result = dict.fromkeys(self.quotas, 0)
        if not from_lenders or not total:
            return result
        exact = {n: from_lenders * offer / total for n, offer in offers.items()}
        for n, value in exact.items():
            result[n] = int(value)
        rest = from_lenders - sum(result.values())
        for n in sorted(exact, key=lambda n: (-(exact[n] - result[n]), n))[:rest]:
            result[n] += 1
        return result


@dataclass(frozen=True)
class QuotaUsage:
    """One quota's figures at one moment, as the CLI, REST API, UI and metrics show them."""

    capacity: int
    in_use: int
    borrowed: int
    lent: int
    free: int
    pending_jobs: int
    pending_gpus: int


def summarize(state: State) -> dict[str, QuotaUsage]:
    """Per-quota figures of a job queue, from the GPUs its running jobs hold right now."""
    usage = Usage(state.capacity, state.quotas)
    in_use = dict.fromkeys(usage.quotas, 0)
    for job in state.running:
        in_use[job.quota] += job.gpus
    for name, gpus in in_use.items():
        usage.add(name, gpus)
    usage.physical = sum(in_use.values())
    lent = usage.lent()
    pending_jobs = dict.fromkeys(usage.quotas, 0)
    pending_gpus = dict.fromkeys(usage.quotas, 0)
    for job in state.pending:
        pending_jobs[job.quota] += 1
        pending_gpus[job.quota] += job.gpus
    return {
        name: QuotaUsage(
            capacity=quota.capacity,
            in_use=usage.used[name],
            borrowed=borrowed(quota, usage.used[name]),
            lent=lent[name],
            free=usage.free_for(name),
            pending_jobs=pending_jobs[name],
            pending_gpus=pending_gpus[name],
        )
        for name, quota in usage.quotas.items()
    }
