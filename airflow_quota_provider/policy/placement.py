"""Placement: how many GPUs each host has free during one decision, and which host a job goes to.

A job's GPUs are all on one host (DESIGN §2, hosts). Each host has two figures, the per-host image
of the queue's physical and logical usage (:mod:`.capacity`):

- *free now*: its GPUs minus those of every running job on it (stopping victims hold theirs until
  they are gone) and of the jobs admitted onto it in this cycle;
- *free once settled*: its GPUs minus those of the running jobs that are not stopping, of the jobs
  admitted onto it, and of the jobs held for it: a preemptor waiting for its victims there (the GPUs
  it waits for are reserved for it at once, so nobody else gets them meanwhile), or a job waiting
  for stopping jobs to release GPUs there.

A job starts on a host where both are at least its GPUs; a victim's GPUs count as free once settled
as soon as it is chosen. Its preemptor waits on one host with room once its victims are gone
(:meth:`Placement.host_for_preemptor`), which holds its victims of its own quota but need not hold
the others': the quota arithmetic may reclaim on other hosts. With one host of the queue's capacity
the two figures are the queue's physical and logical free GPUs, so the policy decides as it does
without hosts. The quota arithmetic (capacity, borrowing, lending) stays queue-wide, in GPUs; a job
starts when both it and a host allow it.

A gang (a job of several nodes) needs one host per node, all different, each with its GPUs per node
(:meth:`Placement.hosts_for`): the fullest that fit, within one rack or else one zone where hosts
carry those labels; it is admitted, held or preempted for on all of them at once, never on part.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable

from airflow_quota_provider.policy.jobs import Host, Job

_HOSTS_SHOWN = 4
"""Hosts a fragmentation reason lists by name (most free first); a fleet has hundreds."""

_TOPOLOGY = ("rack", "zone")
"""Host labels a gang keeps its nodes within, narrowest first."""


class Placement:
    """Free GPUs per host during one decision."""

    def __init__(self, hosts: Iterable[Host], running: Iterable[Job]) -> None:
        hosts = tuple(hosts)
        # Built once per decision (the simulator makes ~10^5): locals, one pass over the running jobs.
        gpus = self.gpus = {host.name: host.gpus for host in hosts}
        now = self.free_now = dict(gpus)
        settled = self.free_settled = dict(gpus)
        job = host = None
        try:
            for job in running:
                if job.nodes == 1:
                    host, used = job.host, job.gpus
                    now[host] -= used
                    if job.preempted_for is None:
                        settled[host] -= used
                    continue
                used = job.gpus_per_node
                for host in job.hosts:
                    now[host] -= used
                    if job.preempted_for is None:
                        settled[host] -= used
        except KeyError:
            raise ValueError(f"running job {job.id!r} is on host {host!r}, not one of {', '.join(gpus)}") from None
        self._hosts = hosts
        self._labels: dict[str, dict[str, str]] | None = None
        self._at_least: dict[int, int] = {}
        self.down = {host.name for host in hosts if host.down}
        for name in self.down:  # nothing starts or waits there until it is back
            now[name] = min(now[name], 0)
            settled[name] = min(settled[name], 0)
        self.names = sorted(gpus)
        self.largest = max(gpus.values(), default=0)
        # Hosts with room now and once settled, by the smaller of the two, each list sorted by name: a
        # best fit looks at no more than ``largest`` buckets, however many hosts there are.
        self._by_free: dict[int, list[str]] = defaultdict(list)
        for name in self.names:
            free = now[name] if now[name] < settled[name] else settled[name]
            if free > 0:
                self._by_free[free].append(name)
        # The same by GPUs free once stopping jobs are gone: where a job that fits nowhere now waits,
        # and a gang preemptor's best fits, without reading every host.
        self._by_settled: dict[int, list[str]] = defaultdict(list)
        for name in self.names:
            if settled[name] > 0:
                self._by_settled[settled[name]].append(name)

    def free(self, host: str) -> int:
        """GPUs a job may start on now without taking any that stopping jobs owe to others."""
        now, settled = self.free_now[host], self.free_settled[host]
        return now if now < settled else settled

    def best_fit(self, gpus: int) -> str | None:
        """The host ``gpus`` fill best (fewest free GPUs left after them, ties by name), or None."""
        for free in range(gpus, self.largest + 1):
            names = self._by_free.get(free)
            if names:
                return names[0]
        return None

    def host_for(self, gpus: int) -> str | None:
        """Where a job that fits its quota goes: the host it fills best now; else the one it fills best
        once stopping jobs are gone, to wait there for them (as it would without hosts) rather than
        preempt more; else None."""
        host = self.best_fit(gpus)
        if host is None:
            for free in range(gpus, self.largest + 1):
                names = self._by_settled.get(free)
                if names:
                    return names[0]
        return host

    def host_for_preemptor(self, preemptor: Job, victims: Iterable[Job], *, stopping: bool) -> str | None:
        """The host ``preemptor`` waits on for ``victims``, or None where none may hold it.

        Victims of other quotas (reclaims) may run anywhere: the quota arithmetic is queue-wide. Victims
        of its own quota must be on its host (a gang of its own quota: one of its nodes): elsewhere their
        GPUs would free while it waits, and they, requeued, could borrow their way back in at once (the
        preemption undone, and done again, in a loop). A host has room when its GPUs free once settled, plus
        those of the victims on it unless they are ``stopping`` already (then counted there), are at least
        its GPUs. The host holding most of the victims' GPUs with room wins (then the best fit, then by
        name), so the fleet keeps its free hosts for others; without victims of its own, else the host a job
        without victims would get (:meth:`host_for`). Asked again in later cycles while the victims stop, it
        gives the same host.
        """
        gpus = preemptor.gpus
        freed, owns = _freed_by(preemptor, victims)
        own = set.intersection(*map(set, owns)) if owns else set()
        if owns and not own:
            return None
        best: tuple | None = None
        for name, gpus_freed in freed.items():
            room = self.free_settled[name] + (0 if stopping else gpus_freed)
            if room >= gpus and name not in self.down and (not own or name in own):
                key = (-gpus_freed, room - gpus, name)
                if best is None or key < best:
                    best = key
        if best is not None:
            return best[2]
        return None if own else self.host_for(gpus)

    # -- gangs: one host per node, all or nothing ------------------------------------------------

    def hosts_for(self, gang: Job) -> tuple[str, ...] | None:
        """Where a gang that fits its quota goes: :meth:`host_for` for each node at once, on as many
        different hosts (:meth:`_pick`): with room now, else once stopping jobs are gone; else None."""
        per, nodes = gang.gpus_per_node, gang.nodes
        if not self._labelled():
            # The free buckets hold the hosts by free GPUs, each sorted by name: the best fits first.
            fits = [name for free in range(per, self.largest + 1) for name in self._by_free.get(free, ())][:nodes]
            hosts = tuple(fits) if len(fits) == nodes else None
        else:
            room = {name: free for free in range(per, self.largest + 1) for name in self._by_free.get(free, ())}
            hosts = self._pick(per, nodes, room)
        if hosts is None:
            hosts = self._pick(per, gang.nodes, self.free_settled)
        return hosts

    def hosts_for_preemptor(self, preemptor: Job, victims: Iterable[Job], *, stopping: bool) -> tuple[str, ...] | None:
        """:meth:`host_for_preemptor` for a gang: its hosts include every host of its own quota's
        victims (at most one per node), then the hosts its victims free most on, then the best fits."""
        per, nodes = preemptor.gpus_per_node, preemptor.nodes
        freed, owns = _freed_by(preemptor, victims)
        own = set().union(*owns)
        if len(own) > nodes:
            return None
        settled, down = self.free_settled, self.down
        room = {name: settled[name] + (0 if stopping else gpus) for name, gpus in freed.items() if name not in down}
        if any(room.get(name, 0) < per for name in own):
            return None
        hosts = sorted(own) + [name for *_, name in sorted(
            (-freed[name], left - per, name) for name, left in room.items() if left >= per and name not in own
        )][:nodes - len(own)]
        for free in range(per, self.largest + 1):  # then the best fits of the hosts with no victims
            if len(hosts) == nodes:
                break
            fits = [name for name in self._by_settled.get(free, ()) if name not in freed and name not in down]
            hosts += fits[:nodes - len(hosts)]
        return tuple(hosts) if len(hosts) == nodes else None

    def nearest_to_room(
        self, gang: Job, ends: dict[str, list[tuple[float, int]]], now: float
    ) -> tuple[tuple[str, ...], float] | None:
        """The ``nodes`` live hosts able to hold a node of ``gang`` to keep for it as they drain, and
        when the last of them is expected to have room for it; None when too few hosts are large
        enough. ``ends``: per host, the expected end and GPUs of each running job there that is not
        stopping (``inf`` where its runtime is unknown). The hosts expected to have room first, then
        those with most GPUs free once settled, then by name: without runtimes, the most free."""
        per = gang.gpus_per_node
        inf = float("inf")
        ranked = []
        for name, free in self.free_settled.items():
            if self.gpus[name] < per or name in self.down:
                continue
            at = now if free >= per else inf
            if at == inf:
                for end, gpus in sorted(ends.get(name, ())):
                    free += gpus
                    if free >= per:
                        at = max(now, end)  # past its expected end: it may end any moment
                        break
            ranked.append((at, -self.free_settled[name], name))
        nearest = heapq.nsmallest(gang.nodes, ranked)
        if len(nearest) < gang.nodes:
            return None
        return tuple(name for _, _, name in nearest), max(at for at, _, _ in nearest)

    def backfill_host(self, gpus: int, kept: tuple[str, ...], held: int) -> str | None:
        """Of the hosts ``kept`` for a gang (``held`` GPUs of each held for it), the one a job of
        ``gpus`` that ends before the gang can start there fills best without the hold, or None."""
        fits = []
        for name in kept:
            room = min(self.free_now[name], self.free_settled[name] + held)
            if room >= gpus:
                fits.append((room - gpus, name))
        return min(fits)[1] if fits else None

    def _pick(self, per: int, nodes: int, room: dict[str, int]) -> tuple[str, ...] | None:
        """``nodes`` different hosts with ``per`` GPUs of ``room`` each, or None: the fullest first
        (fewest left after the node, then by name), all of one rack if some rack has enough, else of
        one zone (the group left fullest), else across the fleet."""
        fits = sorted((left - per, name) for name, left in room.items() if left >= per and name not in self.down)
        if len(fits) < nodes:
            return None
        for label in _TOPOLOGY if self._labelled() else ():
            values = self._labels[label]
            if not values:
                continue
            groups: dict[str, list[str]] = defaultdict(list)
            left_in: dict[str, int] = defaultdict(int)
            for left, name in fits:
                value = values.get(name)
                if value is not None and len(groups[value]) < nodes:
                    groups[value].append(name)
                    left_in[value] += left
            full = [(left_in[value], value) for value, members in groups.items() if len(members) == nodes]
            if full:
                return tuple(groups[min(full)[1]])
        return tuple(name for _, name in fits[:nodes])

    def _labelled(self) -> bool:
        """Whether some host carries a topology label (read once, when a gang first needs to know)."""
        if self._labels is None:
            self._labels = {
                label: {host.name: getattr(host, label) for host in self._hosts if getattr(host, label) is not None}
                for label in _TOPOLOGY
            }
        return any(self._labels.values())

    def room_for(self, job: Job, where: str | tuple[str, ...]) -> bool:
        """Whether ``job``'s GPUs are free now at ``where`` (its host, or a gang's hosts)."""
        if job.nodes == 1:
            return self.free(where) >= job.gpus
        per = job.gpus_per_node
        return all(self.free(name) >= per for name in where)

    def admit_job(self, job: Job, where: str | tuple[str, ...]) -> None:
        for name, gpus in _per_host(job, where):
            self.admit(name, gpus)

    def hold_job(self, job: Job, where: str | tuple[str, ...]) -> None:
        for name, gpus in _per_host(job, where):
            self.hold(name, gpus)

    def live_with_room_settled(self, gpus: int) -> int:
        """How many live hosts have ``gpus`` GPUs free once stopping jobs are gone."""
        settled, by_settled = self.free_settled, self._by_settled
        return (sum(len(by_settled.get(free, ())) for free in range(gpus, self.largest + 1))
                - sum(1 for name in self.down if settled[name] >= gpus))

    def hosts_with_at_least(self, gpus: int) -> int:
        """How many hosts have ``gpus`` GPUs or more, down ones included (they may come back)."""
        count = self._at_least.get(gpus)
        if count is None:
            count = self._at_least[gpus] = sum(1 for size in self.gpus.values() if size >= gpus)
        return count

    def no_hosts(self, gang: Job) -> str:
        """Why a gang that fits its quota waits: fewer than ``nodes`` hosts have its GPUs per node free."""
        per = gang.gpus_per_node
        have = [name for free in range(self.largest, per - 1, -1) for name in self._by_free.get(free, ())]  # most free first
        shown = ", ".join(have[:_HOSTS_SHOWN]) + (f" and {len(have) - _HOSTS_SHOWN} others" if len(have) > _HOSTS_SHOWN else "")
        return (
            f"needs {gang.nodes} hosts with {_gpus(per)} free, {len(have)} {'has' if len(have) == 1 else 'have'}"
            + (f" ({shown})" if have else "")
        )

    def admit(self, host: str, gpus: int) -> None:
        self._change(host, -gpus, -gpus)

    def hold(self, host: str, gpus: int) -> None:
        """Reserve ``gpus`` on ``host`` for a job that waits there for stopping jobs."""
        self._change(host, 0, -gpus)

    def preempt(self, victim: Job) -> None:
        """``victim`` will stop: its GPUs are free once settled (its preemptor takes them)."""
        if victim.nodes == 1:
            self._change(victim.host, 0, victim.gpus)
        else:
            for name in victim.hosts:
                self._change(name, 0, victim.gpus_per_node)

    def _change(self, host: str, now: int, settled: int) -> None:
        old = self.free(host)
        self.free_now[host] += now
        if settled:
            before = self.free_settled[host]
            self.free_settled[host] += settled
            _rebucket(self._by_settled, host, before, before + settled)
        new = self.free(host)
        if new != old:
            _rebucket(self._by_free, host, old, new)

    def no_room(self, gpus: int) -> str:
        """Why a job that fits its quota waits: no host has ``gpus`` free, and what the hosts have."""
        # Most free first, then by name, read from the buckets: the waiting jobs' reasons ask it often,
        # of hundreds of hosts.
        by_free = self._by_free
        total = sum(free * len(names) for free, names in by_free.items())  # only hosts with room are there
        order = [name for free in range(self.largest, 0, -1) for name in by_free.get(free, ())][:_HOSTS_SHOWN]
        if len(order) < _HOSTS_SHOWN:  # then the full hosts, by name
            order += [name for name in self.names if self.free(name) <= 0][:_HOSTS_SHOWN - len(order)]
        most = order[0]
        most_free = max(0, self.free(most))
        block = f"largest free block {_gpus(most_free)} on {most}" if most_free else "every host is full"
        why = f"fragmented: {block}" if total >= gpus else f"{_gpus(total)} free on all hosts together; {block}"
        shown = ", ".join(
            f"{name} down" if name in self.down else f"{name} {self.gpus[name] - max(0, self.free(name))}/{self.gpus[name]}"
            for name in order
        )
        if len(self.names) > _HOSTS_SHOWN:
            shown += f" and {len(self.names) - _HOSTS_SHOWN} others"
        return f"no host has {gpus} free {'GPU' if gpus == 1 else 'GPUs'} ({why}; hosts {shown} in use)"


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"


def _rebucket(buckets: dict[int, list[str]], host: str, before: int, after: int) -> None:
    """Move ``host`` in ``buckets`` (hosts with room by GPUs, each list sorted by name) from ``before``
    GPUs to ``after``; a host without room is in none."""
    if before > 0:
        names = buckets[before]
        del names[bisect_left(names, host)]
    if after > 0:
        insort(buckets[after], host)


def _per_host(job: Job, where: str | tuple[str, ...]) -> tuple[tuple[str, int], ...]:
    """``job``'s GPUs on each host of ``where`` (its host, or a gang's hosts)."""
    if job.nodes == 1:
        return ((where, job.gpus),)
    return tuple((name, job.gpus_per_node) for name in where)


def _freed_by(preemptor: Job, victims: Iterable[Job]) -> tuple[dict[str, int], list[tuple[str, ...]]]:
    """GPUs ``victims`` free per host, and the hosts of each of those of the preemptor's own quota."""
    freed: dict[str, int] = defaultdict(int)
    own: list[tuple[str, ...]] = []
    for victim in victims:
        per = victim.gpus_per_node
        for host in victim.placed_on:
            freed[host] += per
        if victim.quota == preemptor.quota:
            own.append(victim.placed_on)
    return freed, own
