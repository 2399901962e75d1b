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
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import defaultdict
from collections.abc import Iterable

from airflow_quota_provider.policy.jobs import Host, Job

_HOSTS_SHOWN = 4
"""Hosts a fragmentation reason lists by name (most free first); a fleet has hundreds."""


class Placement:
    """Free GPUs per host during one decision."""

    def __init__(self, hosts: Iterable[Host], running: Iterable[Job]) -> None:
        hosts = tuple(hosts)
        # Built once per decision (the simulator makes ~10^5): locals, one pass over the running jobs.
        gpus = self.gpus = {host.name: host.gpus for host in hosts}
        now = self.free_now = dict(gpus)
        settled = self.free_settled = dict(gpus)
        job = None
        try:
            for job in running:
                host, used = job.host, job.gpus
                now[host] -= used
                if job.preempted_for is None:
                    settled[host] -= used
        except KeyError:
            raise ValueError(f"running job {job.id!r} is on host {job.host!r}, not one of {', '.join(gpus)}") from None
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
            fits = [(free - gpus, name) for name, free in self.free_settled.items() if free >= gpus]
            host = min(fits)[1] if fits else None
        return host

    def host_for_preemptor(self, preemptor: Job, victims: Iterable[Job], *, stopping: bool) -> str | None:
        """The host ``preemptor`` waits on for ``victims``, or None where none may hold it.

        Victims of other quotas (reclaims) may run anywhere: the quota arithmetic is queue-wide. Victims
        of its own quota must be on its host: elsewhere their GPUs would free while it waits, and they,
        requeued, could borrow their way back in at once (the preemption undone, and done again, in a
        loop). A host has room when its GPUs free once settled, plus those of the victims on it unless
        they are ``stopping`` already (then counted there), are at least its GPUs. The host holding
        most of the victims' GPUs with room wins (then the best fit, then by name), so the fleet keeps
        its free hosts for others; without victims of its own, else the host a job without victims
        would get (:meth:`host_for`). Asked again in later cycles while the victims stop, it gives the
        same host.
        """
        gpus = preemptor.gpus
        freed: dict[str, int] = defaultdict(int)
        own: set[str] = set()
        for victim in victims:
            freed[victim.host] += victim.gpus
            if victim.quota == preemptor.quota:
                own.add(victim.host)
        if len(own) > 1:
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

    def admit(self, host: str, gpus: int) -> None:
        self._change(host, -gpus, -gpus)

    def hold(self, host: str, gpus: int) -> None:
        """Reserve ``gpus`` on ``host`` for a job that waits there for stopping jobs."""
        self._change(host, 0, -gpus)

    def preempt(self, victim: Job) -> None:
        """``victim`` will stop: its GPUs are free once settled (its preemptor takes them)."""
        self._change(victim.host, 0, victim.gpus)

    def _change(self, host: str, now: int, settled: int) -> None:
        old = self.free(host)
        self.free_now[host] += now
        self.free_settled[host] += settled
        new = self.free(host)
        if new != old:
            if old > 0:
                names = self._by_free[old]
                del names[bisect_left(names, host)]
            if new > 0:
                insort(self._by_free[new], host)

    def no_room(self, gpus: int) -> str:
        """Why a job that fits its quota waits: no host has ``gpus`` free, and what the hosts have."""
        free = {name: max(0, self.free(name)) for name in self.names}
        total = sum(free.values())
        order = sorted(self.names, key=lambda name: (-free[name], name))
        most = order[0]
        block = f"largest free block {_gpus(free[most])} on {most}" if free[most] else "every host is full"
        why = f"fragmented: {block}" if total >= gpus else f"{_gpus(total)} free on all hosts together; {block}"
        shown = ", ".join(
            f"{name} down" if name in self.down else f"{name} {self.gpus[name] - free[name]}/{self.gpus[name]}"
            for name in order[:_HOSTS_SHOWN]
        )
        if len(order) > _HOSTS_SHOWN:
            shown += f" and {len(order) - _HOSTS_SHOWN} others"
        return f"no host has {gpus} free {'GPU' if gpus == 1 else 'GPUs'} ({why}; hosts {shown} in use)"


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
