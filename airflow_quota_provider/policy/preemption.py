"""The victim search: the smallest useful set of candidates whose GPUs let a waiting job in.

Kueue's classical search: add candidates in order until the job fits, then walk back over the chosen
ones in reverse order of choice (skipping the last) and give back each whose return still leaves
room. It runs on the decision's live :class:`Usage` and always restores it, so deciding stays apart
from acting: the caller applies the victims it accepts.

With hosts, a job's GPUs are all on one host, but the quota arithmetic is queue-wide: a set fits
when the quota arithmetic fits with all its victims, wherever they run, *and* one host's GPUs free
once settled (:mod:`.placement`) plus those of the victims on it make room for the job. The search
first takes the set it would take without hosts; if that leaves room on some host (an idle one, or
the one its victims free), it is the answer, so hosts never cost an extra victim that placement does
not force. Otherwise each host is searched for the set that also makes room there, and the cheapest
set (:func:`~airflow_quota_provider.policy.ordering.victim_set_order`) wins.

A gang preemptor needs room on as many hosts as it has nodes: when the set without hosts does not
leave it that, the hosts it lacks are those whose cheapest candidates make room most cheaply, their
candidates are taken first, then any until the quota arithmetic fits, and the give-back keeps both.
A gang victim is one victim, and frees its GPUs per node on each of its hosts.
"""

from __future__ import annotations

import heapq

from airflow_quota_provider.policy.candidates import Candidates
from airflow_quota_provider.policy.capacity import Usage
from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.ordering import victim_cost, victim_set_order
from airflow_quota_provider.policy.placement import Placement
from airflow_quota_provider.policy.preemption_policy import NOBODY, borrow_within_ceiling, reclaim_ceiling
from airflow_quota_provider.policy.vocabulary import PreemptionReason

Victims = list[tuple[Job, str]]


def search_phases(preemptor: Job, quota: Quota, usage: Usage) -> list[bool]:
    """The phases to try, as ``borrow`` flags.

    Phase 1 (``False``) looks for a set after which the quota does not borrow, and is tried only while
    the quota is below its capacity. With cohorts, phase 1 reclaims at a level only for a preemptor
    whose side of that level ends within its share, so it is tried while the quota or a cohort above
    it is below its share. Phase 2 (``True``) allows the quota to end up borrowing; a job
    asking for more than its quota's capacity can never be within it, so it is tried for such a job
    only when the quota has ``borrow_within``.
    """
    phases = []
    if usage.below_share(quota.name):
        phases.append(False)
    if preemptor.gpus <= quota.capacity or quota.preemption.borrow_within is not None:
        phases.append(True)
    return phases


def find_victims(
    preemptor: Job,
    quota: Quota,
    usage: Usage,
    candidates: Candidates,
    phases: list[bool],
    placement: Placement | None = None,
    *,
    may_borrow: bool = True,
) -> Victims | None:
    """Victims (in order of choice, each with its reason) that make ``preemptor`` fit, or None.

    ``phases`` comes from :func:`search_phases`, possibly narrowed by the caller. With ``placement``
    (hosts) some host has room for the preemptor once they are gone
    (:meth:`~.placement.Placement.host_for_preemptor` says which). With cohorts, phase 1
    lets the quota itself borrow within its cohort when ``may_borrow`` (the borrowing pass), as long
    as each level it reclaims at ends within its share.
    """
    own = candidates.own_at_most(preemptor.priority, quota) if phases else 0
    for borrow in phases:
        if not may_find(preemptor.priority, preemptor.gpus, own, quota, usage, borrow=borrow):
            continue
        victims = _minimal_set(preemptor, quota, usage, candidates, borrow=borrow, may_borrow=may_borrow)
        if victims and placement is not None:
            chosen = (victim for victim, _ in victims)
            if preemptor.nodes > 1:
                if placement.hosts_for_preemptor(preemptor, chosen, stopping=False) is None:
                    victims = _minimal_set(
                        preemptor, quota, usage, candidates, borrow=borrow, may_borrow=may_borrow, gang_room=placement
                    )
            elif placement.host_for_preemptor(preemptor, chosen, stopping=False) is None:
                victims = _making_room(preemptor, quota, usage, candidates, placement, borrow=borrow, may_borrow=may_borrow)
        if victims:
            return victims
    return None


def _making_room(
    preemptor: Job, quota: Quota, usage: Usage, candidates: Candidates, placement: Placement, *, borrow: bool, may_borrow: bool
) -> Victims | None:
    """The cheapest set over the hosts that also makes room on one, when the set without hosts
    leaves room on none (or takes its own quota's victims on several hosts).

    The walk goes through all candidates in the search's order (cheapest first) and searches each
    host when its cheapest candidate comes up, skipping hosts whose candidates cannot free enough
    GPUs whatever the rules. It stops at the first candidate costlier than the best set's costliest
    victim: a host whose candidates all cost more cannot have a cheaper set. So it finds the set an
    exhaustive search over the hosts would when every host's set holds a victim on it (as when the
    set without hosts left room nowhere), at the cost of a few hosts' searches, not a fleet's; a host
    with room that holds no candidate is not searched. Ties (two hosts' sets of the same victims) go
    to the host met first.
    """
    best: Victims | None = None
    best_key: tuple = ()
    tried: set[str] = set()
    for candidate, _ in candidates.for_preemptor(preemptor, quota, usage, borrow=borrow):
        if best is not None and victim_cost(candidate, preemptor, candidates.order) > best_key[0]:
            break
        for host in candidate.placed_on:
            if host in tried or host in placement.down:
                continue
            tried.add(host)
            room = placement.free_settled[host]
            if room + candidates.gpus_on(host) < preemptor.gpus:
                continue
            victims = _minimal_set(
                preemptor, quota, usage, candidates, borrow=borrow, may_borrow=may_borrow, host=host, room=room
            )
            if victims:
                key = victim_set_order([victim for victim, _ in victims], preemptor, candidates.order)
                if best is None or key < best_key:
                    best, best_key = victims, key
    return best


def may_find(priority: int, gpus: int, own: int, quota: Quota, usage: Usage, *, borrow: bool) -> bool:
    """Cheap necessary conditions for a phase to succeed for a preemptor of ``priority`` asking for
    ``gpus``, whose rules let it take at most ``own`` GPUs of its own quota
    (:meth:`~.candidates.Candidates.own_at_most`), so that hopeless searches skip the walk. A higher
    priority, fewer GPUs or a larger ``own`` never turn True into False.

    A failed search walks every candidate; on a busy queue most phase-1 searches fail because only
    the quota's own victims lower its own usage, and they cannot bring it under its capacity.
    """
    policy = quota.preemption
    ceiling = borrow_within_ceiling(policy.borrow_within, priority) if borrow else reclaim_ceiling(policy.reclaim, priority)
    if ceiling == NOBODY and not own:
        return False  # no rule allows any victim
    # Phase 1 ends within the quota's capacity (with cohorts: some level's share); victims of other
    # quotas do not lower its usage.
    return borrow or usage.may_end_within(quota.name, gpus - own)


def _minimal_set(
    preemptor: Job,
    quota: Quota,
    usage: Usage,
    candidates: Candidates,
    *,
    borrow: bool,
    may_borrow: bool = True,
    host: str | None = None,
    room: int = 0,
    gang_room: Placement | None = None,
) -> Victims | None:
    """With ``host``, the victims must also free what its ``room`` (GPUs free once settled) lacks for
    the job: its candidates are taken first, in order, until they do, then any until the quota
    arithmetic fits, and the give-back keeps both conditions.

    With ``gang_room`` (a gang preemptor), candidates are taken in order until the quota arithmetic
    fits *and* the gang has a host with room for each node
    (:meth:`~.placement.Placement.hosts_for_preemptor`); the give-back keeps both. A gang victim is
    one victim wherever its nodes run.

    With cohorts, ``levels`` counts the reclaim victims per level of the preemptor's path (0: its
    quota, the level of a victim: the preemptor's side of their lowest common cohort): each level
    counted must end within its share, and the quota itself may borrow in phase 1 if ``may_borrow``.
    """
    lacking = preemptor.gpus - room if host is not None else 0
    tree = usage.tree
    levels = None if tree is None else [0] * len(tree.path[quota.name])
    fit_borrow = may_borrow if levels is not None and not borrow else borrow
    chosen: Victims = []
    freed = 0  # on ``host``

    def take(candidate: Job, reason: str) -> bool:
        """Choose ``candidate``; whether the quota arithmetic fits now."""
        nonlocal freed
        usage.remove(candidate.quota, candidate.gpus)
        chosen.append((candidate, reason))
        freed += _freed_on(candidate, host)
        if levels is not None and reason == PreemptionReason.RECLAIM:
            levels[tree.relation(quota.name, candidate.quota)[0]] += 1
        return usage.fits(quota.name, preemptor.gpus, borrow=fit_borrow, within=levels) and (
            gang_room is None or gang_room.hosts_for_preemptor(preemptor, (v for v, _ in chosen), stopping=False) is not None
        )

    fits = False
    chosen_ids: set[str] = set()
    if lacking > 0:
        # Room first: the host's candidates in order until they free what it lacks. Taking the quota's
        # victims first could spend a borrowing quota's excess on another host, leaving none to reclaim here.
        for candidate, reason in candidates.on_host(preemptor, quota, usage, host, borrow=borrow):
            quota_fits = take(candidate, reason)
            if freed >= lacking:
                fits = quota_fits
                break
        chosen_ids = {victim.id for victim, _ in chosen}
    elif gang_room is not None:
        # Room first on each host the gang lacks (:func:`_gang_targets`), as on one host above.
        targets = _gang_targets(preemptor, quota, usage, candidates, gang_room, borrow=borrow)
        if targets is None:
            return None
        for target in targets:
            short = preemptor.gpus_per_node - gang_room.free_settled[target] - sum(_freed_on(v, target) for v, _ in chosen)
            for candidate, reason in candidates.on_host(preemptor, quota, usage, target, borrow=borrow):
                if short <= 0:
                    break
                if candidate.id not in chosen_ids:
                    chosen_ids.add(candidate.id)
                    fits = take(candidate, reason)
                    short -= _freed_on(candidate, target)
    if freed >= lacking and not fits:
        for candidate, reason in candidates.for_preemptor(preemptor, quota, usage, borrow=borrow):
            if candidate.id in chosen_ids or (
                host is not None and candidate.quota == quota.name and host not in candidate.placed_on
            ):
                continue  # its own quota's victims only where it runs (Placement.host_for_preemptor)
            if take(candidate, reason):
                fits = True
                break
    if fits:
        given_back = set()
        for index in range(len(chosen) - 2, -1, -1):
            candidate, reason = chosen[index]
            usage.add(candidate.quota, candidate.gpus)
            level = tree.relation(quota.name, candidate.quota)[0] if levels is not None and reason == PreemptionReason.RECLAIM else None
            if level is not None:
                levels[level] -= 1
            here = _freed_on(candidate, host)
            if (
                freed - here >= lacking
                and usage.fits(quota.name, preemptor.gpus, borrow=fit_borrow, within=levels)
                and (gang_room is None or gang_room.hosts_for_preemptor(
                    preemptor, (v for i, (v, _) in enumerate(chosen) if i != index and i not in given_back), stopping=False
                ) is not None)
            ):
                given_back.add(index)
                freed -= here
            else:
                usage.remove(candidate.quota, candidate.gpus)
                if level is not None:
                    levels[level] += 1
        chosen = [victim for index, victim in enumerate(chosen) if index not in given_back]
    for candidate, _ in chosen:  # restore the snapshot
        usage.add(candidate.quota, candidate.gpus)
    return chosen if fits else None


def _freed_on(victim: Job, host: str | None) -> int:
    """GPUs ``victim`` frees on ``host`` (all of them without one): a gang's node's where it runs one."""
    if host is None:
        return victim.gpus
    if victim.nodes == 1:
        return victim.gpus if victim.host == host else 0
    return victim.gpus_per_node if host in victim.hosts else 0


_GANG_HOSTS_SEARCHED = 8
"""Hosts a gang's search looks at beyond those it needs (:func:`_gang_targets`)."""


def _gang_targets(
    preemptor: Job, quota: Quota, usage: Usage, candidates: Candidates, placement: Placement, *, borrow: bool
) -> list[str] | None:
    """The hosts a gang's victims make room on: as many as it lacks hosts with room for a node, those
    whose cheapest candidates make room most cheaply (:func:`victim_set_order`), among those nearest to
    room; None when too few can."""
    per = preemptor.gpus_per_node
    settled = placement.free_settled
    need = preemptor.nodes - placement.live_with_room_settled(per)
    if need <= 0:
        return []
    costs = []
    # The hosts nearest to room first, and a few more than it needs: a fleet has hundreds, and a
    # host that lacks more rarely makes room more cheaply.
    down = placement.down
    near = heapq.nsmallest(need + _GANG_HOSTS_SEARCHED, (
        (per - settled[name], name) for name, gpus in candidates.gpus_by_host().items()
        if name not in down and 0 < per - settled[name] <= gpus
    ))
    for lacking, name in near:
        taken, freed = [], 0
        for candidate, _ in candidates.on_host(preemptor, quota, usage, name, borrow=borrow):
            taken.append(candidate)
            freed += _freed_on(candidate, name)
            if freed >= lacking:
                costs.append((victim_set_order(taken, preemptor, candidates.order), name))
                break
    if len(costs) < need:
        return None
    return [name for _, name in sorted(costs)[:need]]
