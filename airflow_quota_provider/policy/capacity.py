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

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # config validates the tree with this module's arithmetic: types only here
    from airflow_quota_provider.policy.config import Cohort, Quota
    from airflow_quota_provider.policy.state import State


def lendable(quota: Quota, used: int) -> int:
    """GPUs of ``quota``'s capacity that other quotas may use while it uses ``used`` of them."""
    if not quota.lends:
        return 0
    floor = used if used > quota.private else quota.private
    return quota.capacity - floor if floor < quota.capacity else 0


def borrowed(quota: Quota, used: int) -> int:
    return used - quota.capacity if used > quota.capacity else 0


def ever_fits(quota: Quota, quotas: Iterable[Quota], capacity: int, cohorts: Sequence[Cohort] = ()) -> int:
    """The most GPUs ``quota`` (one of ``quotas``) can ever hold: its capacity, plus what it may borrow
    when all else is idle."""
    return ever_fits_each(quotas, capacity, cohorts)[quota.name]


_last_ever_fits: list = [None]
"""The last :func:`ever_fits_each` asked of tuples, with its answer."""


def ever_fits_each(quotas: Iterable[Quota], capacity: int, cohorts: Sequence[Cohort] = ()) -> dict[str, int]:
    """:func:`ever_fits` of every quota of a job queue, for the cost of one. Callers only read it.

    Asked again of the same tuples (a caller that decides often, the simulator, passes its queue's own
    cycle after cycle) it answers from the last time: tuples of frozen quotas and cohorts cannot change.
    """
    last = _last_ever_fits[0]
    if last is not None and last[0] is quotas and last[1] == capacity and last[2] is cohorts:
        return last[3]
    result = _ever_fits_each(tuple(quotas), capacity, tuple(cohorts))
    if isinstance(quotas, tuple) and isinstance(cohorts, tuple):
        _last_ever_fits[0] = (quotas, capacity, cohorts, result)
    return result


def _ever_fits_each(quotas: tuple[Quota, ...], capacity: int, cohorts: tuple[Cohort, ...]) -> dict[str, int]:
    if cohorts:
        tree = CohortTree(capacity, quotas, cohorts)
        return {quota.name: tree.most(quota.name) for quota in quotas}
    private = sum(q.private for q in quotas)
    result = {}
    for quota in quotas:
        most = quota.capacity
        if quota.borrows:
            most = capacity - (private - quota.private)  # all but the others' private capacity
            if quota.borrow_limit is not None:
                most = min(most, quota.capacity + quota.borrow_limit)
        result[quota.name] = most
    return result


_last_by_name: list = [None]
"""The last :func:`_by_name` asked of a tuple, with its answer."""


def _by_name(quotas: Iterable[Quota], capacity: int) -> tuple[dict[str, Quota], int]:
    """A job queue's quotas by name, and its common pool (what their capacities leave of ``capacity``).
    Callers only read the dict: asked again of the same tuple (every cycle of a replay) it is reused."""
    last = _last_by_name[0]
    if last is not None and last[0] is quotas and last[1] == capacity:
        return last[2], last[3]
    by_name = {q.name: q for q in quotas}
    common = capacity - sum(q.capacity for q in by_name.values())
    if isinstance(quotas, tuple):
        _last_by_name[0] = (quotas, capacity, by_name, common)
    return by_name, common


class Usage:
    """Mutable usage of one job queue during one decision; every check is O(1)."""

    def __init__(self, capacity: int, quotas: Iterable[Quota], in_use: dict[str, int] | None = None) -> None:
        """``in_use``: GPUs per quota to start from (:meth:`add` for each, summed once here)."""
        self.tree: CohortTree | None = None
        """The queue's cohorts (:class:`TreeUsage`); None: the quotas are flat."""
        self.capacity = capacity
        self.quotas, common = _by_name(quotas, capacity)
        used = self.used = dict.fromkeys(self.quotas, 0)
        for name, gpus in (in_use or {}).items():
            used[name] += gpus
        self.physical = 0
        supply = borrowed_total = 0
        for name, quota in self.quotas.items():  # one pass: a cycle starts here, many per second
            if used[name] >= quota.capacity:  # lends nothing, borrows the rest: the hot case of a busy queue
                borrowed_total += used[name] - quota.capacity
            else:
                supply += lendable(quota, used[name])
        self.common = common
        self.supply = common + supply
        self.borrowed_total = borrowed_total

    def _set(self, name: str, new: int) -> None:
        quota = self.quotas[name]
        old = self.used[name]
        if old >= quota.capacity and new >= quota.capacity:  # lends nothing before or after: the hot case
            self.borrowed_total += new - old
        else:
            self.supply += lendable(quota, new) - lendable(quota, old)
            self.borrowed_total += borrowed(quota, new) - borrowed(quota, old)
        self.used[name] = new

    def add(self, name: str, gpus: int) -> None:
        self._set(name, self.used[name] + gpus)

    def remove(self, name: str, gpus: int) -> None:
        self._set(name, self.used[name] - gpus)

    def fits(self, name: str, gpus: int, *, borrow: bool, within: list[int] | None = None) -> bool:
        """Whether ``gpus`` more for quota ``name`` keep the queue balanced (ignoring physical usage).

        With ``borrow=False`` the quota must stay within its own capacity. ``within`` is for cohorts
        (:meth:`TreeUsage.fits`); a flat queue has no level but the quota's.
        """
        quota = self.quotas[name]
        old = self.used[name]
        new = old + gpus
        if new > quota.capacity:
            if not (borrow and quota.borrows):
                return False
            if quota.borrow_limit is not None and new - quota.capacity > quota.borrow_limit:
                return False
            if old >= quota.capacity:  # lends nothing before or after, borrows each GPU more: the hot case
                return self.borrowed_total + gpus <= self.supply
        supply = self.supply + lendable(quota, new) - lendable(quota, old)
        borrowed_total = self.borrowed_total + borrowed(quota, new) - borrowed(quota, old)
        return borrowed_total <= supply

    def physically_free(self) -> int:
        return self.capacity - self.physical

    def below_share(self, name: str) -> bool:
        """Whether a reclaim could be for quota ``name``: it is below its capacity."""
        return self.used[name] < self.quotas[name].capacity

    def may_end_within(self, name: str, gpus: int) -> bool:
        """Whether ``gpus`` more (fewer, when negative) leave quota ``name`` within its capacity."""
        return self.used[name] + gpus <= self.quotas[name].capacity

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
        offers = {n: lendable(q, self.used[n]) for n, q in self.quotas.items()}
        # Never more than is lendable: an over-committed moment (a quota file edited under running
        # jobs) has borrowers holding more than the pool and the lenders offer.
        return _apportion(min(max(0, self.borrowed_total - self.common), sum(offers.values())), offers)


class CohortTree:
    """The shape of a job queue whose quotas are grouped in cohorts, and its fixed figures.

    Kueue's hierarchical cohorts: every node (a quota, a cohort, the job queue's root) has a
    *subtree quota*, what it owns plus what its children lend into it, and a *guaranteed* part that
    it never lends to its parent (a quota's private capacity; a cohort's subtree quota above its
    ``lend_limit``). A node's *usage* is what its children use beyond their guaranteed parts (a
    quota's: its jobs' GPUs). A node borrows from its parent when its usage is above its subtree
    quota, by at most its ``borrow_limit``; the root's usage never exceeds its subtree quota. With
    every quota a child of the root this is exactly the flat rule of :class:`Usage`.

    Cohorts are numbered in the order given, the root after them; ``path[quota]`` lists the cohorts
    from the quota's up to the root.
    """

    def __init__(self, capacity: int, quotas: tuple[Quota, ...], cohorts: tuple[Cohort, ...]) -> None:
        index = {cohort.name: i for i, cohort in enumerate(cohorts)}
        self.root = root = len(cohorts)
        self.names = [cohort.name for cohort in cohorts] + [""]
        self.parent: list[int | None] = [index[c.parent] if c.parent is not None else root for c in cohorts] + [None]
        self.own = [cohort.capacity for cohort in cohorts] + [
            capacity - sum(q.capacity for q in quotas) - sum(c.capacity for c in cohorts)
        ]
        self.borrow_limit = [cohort.borrow_limit for cohort in cohorts] + [None]
        self.quotas = {quota.name: quota for quota in quotas}
        self.path: dict[str, tuple[int, ...]] = {}
        for quota in quotas:
            node = index[quota.cohort] if quota.cohort is not None else root
            self.path[quota.name] = self._up(node)
        self.depth = [len(self._up(node)) - 1 for node in range(root + 1)]
        self.total = list(self.own)
        """GPUs each node's subtree owns: its capacity and its members' (for people to read)."""
        self.sq = list(self.own)
        for quota in quotas:
            self.total[self.path[quota.name][0]] += quota.capacity
            self.sq[self.path[quota.name][0]] += quota.capacity - quota.private
        self.guaranteed = [0] * (root + 1)
        for node in sorted(range(root), key=lambda n: -self.depth[n]):  # children before parents
            limit = cohorts[node].lend_limit
            self.guaranteed[node] = 0 if limit is None else max(0, self.sq[node] - limit)
            self.sq[self.parent[node]] += self.sq[node] - self.guaranteed[node]
            self.total[self.parent[node]] += self.total[node]
        self._relations: dict[tuple[str, str], tuple[int, int, tuple[int, ...]]] = {}

    def _up(self, node: int) -> tuple[int, ...]:
        path = [node]
        while self.parent[path[-1]] is not None:
            path.append(self.parent[path[-1]])
        return tuple(path)

    def members(self, node: int) -> list[str]:
        """The quotas in ``node``'s subtree, in the file's order."""
        return [name for name, path in self.path.items() if node in path]

    def relation(self, preemptor: str, victim: str) -> tuple[int, int, tuple[int, ...]]:
        """Where quota ``victim`` is from quota ``preemptor``: ``(side, depth, chain)``.

        ``side`` is the position on the preemptor's side of their lowest common cohort (0: the
        preemptor's quota, ``k``: the ``k``-th cohort above it), ``depth`` that cohort's depth (the
        root's is 0), and ``chain`` the cohorts on the victim's side below it, lowest first.
        """
        key = (preemptor, victim)
        found = self._relations.get(key)
        if found is None:
            theirs = self.path[victim]
            for side, node in enumerate(self.path[preemptor]):
                if node in theirs:
                    found = (side, self.depth[node], theirs[: theirs.index(node)])
                    break
            self._relations[key] = found
        return found

    def most(self, name: str) -> int:
        """The most GPUs quota ``name`` can ever hold: Kueue's available capacity with all else idle."""
        available = self.sq[self.root]
        for node in reversed(self.path[name][:-1]):
            if self.borrow_limit[node] is not None:
                available = min(available, self.sq[node] - self.guaranteed[node] + self.borrow_limit[node])
            available += self.guaranteed[node]
        quota = self.quotas[name]
        if not quota.borrows:
            return min(available + quota.private, quota.capacity)
        if quota.borrow_limit is not None:
            available = min(available, quota.capacity - quota.private + quota.borrow_limit)
        return available + quota.private


class TreeUsage(Usage):
    """:class:`Usage` of a job queue with cohorts: each check walks the quota's path, O(depth)."""

    def __init__(self, capacity: int, quotas: Iterable[Quota], tree: CohortTree, in_use: dict[str, int] | None = None) -> None:
        self.capacity = capacity
        self.quotas, _ = _by_name(quotas, capacity)
        self.used = dict.fromkeys(self.quotas, 0)
        self.physical = 0
        self.tree = tree
        self.node_used = [0] * (tree.root + 1)
        self.borrow_starts = 0
        """Counts the times a quota or a cohort started borrowing: its jobs may have become candidates."""
        for name, gpus in (in_use or {}).items():
            self.add(name, gpus)

    def _set(self, name: str, new: int) -> None:
        quota = self.quotas[name]
        old = self.used[name]
        self.used[name] = new
        if old <= quota.capacity < new:
            self.borrow_starts += 1
        tree, used = self.tree, self.node_used
        floor = quota.private
        delta = (new - floor if new > floor else 0) - (old - floor if old > floor else 0)
        for node in tree.path[name]:
            if not delta:
                return
            before = used[node]
            after = used[node] = before + delta
            if before <= tree.sq[node] < after and node != tree.root:
                self.borrow_starts += 1
            floor = tree.guaranteed[node]
            delta = (after - floor if after > floor else 0) - (before - floor if before > floor else 0)

    def fits(self, name: str, gpus: int, *, borrow: bool, within: list[int] | None = None) -> bool:
        """Whether ``gpus`` more for quota ``name`` keep every node on its path within its limits.

        With ``borrow=False`` the quota must stay within its own capacity; ``within[k]`` non-zero
        says the same of the ``k``-th node on its path (0: the quota): it must end within its
        subtree quota (a reclaim was made for it at the level above).
        """
        quota = self.quotas[name]
        old = self.used[name]
        new = old + gpus
        if new > quota.capacity:
            if not (borrow and quota.borrows) or (within and within[0]):
                return False
            if quota.borrow_limit is not None and new - quota.capacity > quota.borrow_limit:
                return False
        tree, used = self.tree, self.node_used
        floor = quota.private
        delta = (new - floor if new > floor else 0) - (old - floor if old > floor else 0)
        for position, node in enumerate(tree.path[name], 1):
            before = used[node]
            after = before + delta
            if node == tree.root:
                return after <= tree.sq[node]
            limit = tree.borrow_limit[node]
            if delta > 0 and limit is not None and after > tree.sq[node] + limit:
                return False
            if within and within[position] and after > tree.sq[node]:
                return False
            floor = tree.guaranteed[node]
            delta = (after - floor if after > floor else 0) - (before - floor if before > floor else 0)
        return True  # unreachable: every path ends at the root

    def node_borrowing(self, node: int) -> bool:
        return self.node_used[node] > self.tree.sq[node]

    def over(self, node: int) -> int:
        """GPUs cohort ``node`` uses above its subtree quota (borrowed from its parent)."""
        return max(0, self.node_used[node] - self.tree.sq[node])

    def ends_within(self, name: str, gpus: int, freed: list[int] | None = None) -> list[bool]:
        """Per position on quota ``name``'s path below the root (0: the quota): whether that node is
        within its subtree quota once the quota holds ``gpus`` more (fewer, when negative).

        ``freed[k]``: GPUs that other quotas below the path's ``k``-th cohort (0: the quota's own), on
        other sides of it than the quota's, may give back. They lower that cohort's usage only when the
        position below it ends within (a reclaim at that cohort is then allowed), so each level counts
        what the reclaims beneath it free (an upper bound when ``freed`` is one).
        """
        quota = self.quotas[name]
        old = self.used[name]
        new = old + gpus
        result = [new <= quota.capacity]
        tree, used = self.tree, self.node_used
        floor = quota.private
        delta = (new - floor if new > floor else 0) - (old - floor if old > floor else 0)
        for position, node in enumerate(tree.path[name][:-1]):
            before = used[node]
            after = before + delta
            if freed is not None and result[position]:
                after -= freed[position]
            result.append(after <= tree.sq[node])
            floor = tree.guaranteed[node]
            delta = (after - floor if after > floor else 0) - (before - floor if before > floor else 0)
        return result

    def lender_depth(self, name: str, gpus: int) -> int:
        """The depth of the lowest node on quota ``name``'s path whose share holds ``gpus`` more: the
        level it borrows at (the quota's own depth when it borrows nothing; the root's, 0, at most)."""
        ends_within = self.ends_within(name, gpus)
        path = self.tree.path[name]
        for position, within in enumerate(ends_within):
            if within:
                return self.tree.depth[path[0]] + 1 if position == 0 else self.tree.depth[path[position - 1]]
        return 0

    def below_share(self, name: str) -> bool:
        """A reclaim could be for quota ``name`` while it or a cohort above it is below its share."""
        return self.used[name] < self.quotas[name].capacity or any(
            self.node_used[node] < self.tree.sq[node] for node in self.tree.path[name][:-1]
        )

    def may_end_within(self, name: str, gpus: int) -> bool:
        return any(self.ends_within(name, gpus))

    def share(self, name: str) -> tuple[float, ...]:
        """Fair sharing per level: the borrowed GPUs of each cohort on the path, from the top, then
        the quota's borrowed GPUs per unit of weight (cohorts weigh 1)."""
        path = self.tree.path[name]
        return (*(self.over(node) for node in reversed(path[:-1])), super().share(name))

    def full_cohort(self, name: str, gpus: int) -> int | None:
        """The lowest cohort on quota ``name``'s path (below the root) that ``gpus`` more would take
        above its subtree quota, or None."""
        quota = self.quotas[name]
        old = self.used[name]
        tree, used = self.tree, self.node_used
        floor = quota.private
        delta = max(0, old + gpus - floor) - max(0, old - floor)
        for node in tree.path[name][:-1]:
            after = used[node] + delta
            if after > tree.sq[node]:
                return node
            floor = tree.guaranteed[node]
            delta = max(0, after - floor) - max(0, used[node] - floor)
        return None

    def lent(self) -> dict[str, int]:
        return self.lent_by_node()[0]

    def lent_by_node(self) -> tuple[dict[str, int], list[int]]:
        """GPUs of each quota's capacity in use by others, and of each cohort's subtree in use outside it.

        At each level the borrowers draw on the cohort's own capacity first, then on its children in
        proportion to what each lends (largest remainder, ties by name); what a cohort lends to its
        parent's level is drawn the same way from its own capacity and its children.
        """
        tree, used = self.tree, self.node_used
        # Offers are keyed ("cohort", name) or ("quota", name): ties go to cohorts, then by name.
        children: dict[int, list[tuple[tuple[str, str], int, int]]] = {node: [] for node in range(tree.root + 1)}
        for name, quota in self.quotas.items():
            offer = (lendable(quota, self.used[name]), borrowed(quota, self.used[name]))
            children[tree.path[name][0]].append((("quota", name), *offer))
        for node in range(tree.root):
            idle = max(0, tree.sq[node] - max(used[node], tree.guaranteed[node]))
            children[tree.parent[node]].append((("cohort", tree.names[node]), idle, self.over(node)))
        node_of = {name: node for node, name in enumerate(tree.names)}
        quota_lent = dict.fromkeys(self.quotas, 0)
        node_lent = [0] * (tree.root + 1)
        for node in sorted(range(tree.root + 1), key=lambda n: tree.depth[n]):  # parents first
            offers = {key: idle for key, idle, _ in children[node]}
            demand = sum(owed for _, _, owed in children[node]) + node_lent[node]
            from_children = min(sum(offers.values()), max(0, demand - tree.own[node]))
            for (kind, name), amount in _apportion(from_children, offers).items():
                if kind == "quota":
                    quota_lent[name] = amount
                else:
                    node_lent[node_of[name]] = amount
        return quota_lent, node_lent


def _apportion(total: int, offers: dict[Hashable, int]) -> dict[Hashable, int]:
    """``total`` split in proportion to ``offers`` (largest remainder, ties by key)."""
    result = dict.fromkeys(offers, 0)
    whole = sum(offers.values())
    if not total or not whole:
        return result
    exact = {key: total * offer / whole for key, offer in offers.items()}
    for key, value in exact.items():
        result[key] = int(value)
    rest = total - sum(result.values())
    for key in sorted(exact, key=lambda key: (-(exact[key] - result[key]), key))[:rest]:
        result[key] += 1
    return result


def usage_for(state: State, in_use: dict[str, int] | None = None) -> Usage:
    """The usage of ``state``'s job queue, flat or over its cohorts: all zero, or ``in_use`` (GPUs per
    quota) added."""
    if not state.cohorts:
        return Usage(state.capacity, state.quotas, in_use)
    return TreeUsage(state.capacity, state.quotas, CohortTree(state.capacity, state.quotas, state.cohorts), in_use)


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


def _running(state: State) -> Usage:
    """The usage of the GPUs ``state``'s running jobs hold right now."""
    in_use = dict.fromkeys((quota.name for quota in state.quotas), 0)
    for job in state.running:
        in_use[job.quota] += job.gpus
    usage = usage_for(state, in_use)
    usage.physical = sum(in_use.values())
    return usage


def summarize(state: State) -> dict[str, QuotaUsage]:
    """Per-quota figures of a job queue, from the GPUs its running jobs hold right now."""
    usage = _running(state)
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


@dataclass(frozen=True)
class CohortUsage:
    """One cohort's figures at one moment: its subtree's GPUs and how they are shared."""

    parent: str | None
    capacity: int
    """GPUs its subtree owns: its own capacity and its members'."""
    in_use: int
    """GPUs its quotas' jobs hold."""
    borrowed: int
    """GPUs its subtree uses above its subtree quota, from the rest of the tree."""
    lent: int
    """GPUs of its subtree's capacity in use outside it."""


def summarize_cohorts(state: State) -> dict[str, CohortUsage]:
    """Per-cohort figures of a job queue (empty without cohorts), in the file's order."""
    if not state.cohorts:
        return {}
    usage = _running(state)
    tree = usage.tree
    _, lent = usage.lent_by_node()
    return {
        cohort.name: CohortUsage(
            parent=cohort.parent,
            capacity=tree.total[node],
            in_use=sum(usage.used[name] for name in tree.members(node)),
            borrowed=usage.over(node),
            lent=lent[node],
        )
        for node, cohort in enumerate(state.cohorts)
    }
