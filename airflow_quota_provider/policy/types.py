"""GPU types (issue 33): a job queue whose capacity is a mapping ``{type: GPUs}``, Kueue's
ResourceFlavors and AWS Batch's per-instance-type capacity limits.

A typed job queue is decided as one untyped queue per type (:class:`GpuType`: that type's capacities
of the queue, its quotas and its cohorts), so the quota arithmetic stays the one of
:mod:`.capacity`, applied per type, and a job never runs on a type beyond that type's limits. Each
cycle first gives every waiting job one type to try (:func:`assign_types`): its own preference
(``gpu_type``, a name or a list) or, untyped, the queue's order; the first type where it fits within
its quota, else, by the queue's :class:`Fungibility`, the first where it may borrow or where
preempting could make room (Kueue's ``whenCanBorrow`` / ``whenCanPreempt``). A job held for its
victims keeps their type. Then each type decides on its own jobs (:func:`decide_types`); a waiting
job's reason names the type it waits on.

Every running job counts on exactly one type (:func:`charged_type`), so none of its GPUs is free for
others unseen: its own ``gpu_type``; else, for a job whose type is none of the queue's (admitted before
the quota file had types, or of a type the file has since dropped), the type of the host it runs on;
else, where that host has none of the queue's types or the state has no hosts, the queue's first type,
where an untyped job goes first. That is one type, not every one: a job counted on several types
would be a victim, and freed, on each. A host with none of the queue's types counts for no type (which
type its GPUs are is unknown), and nothing new starts there. Both are said in every waiting job's
reason while they last (:func:`decide_types`), since the figures there are not what the hosts show.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from operator import itemgetter
from enum import Enum
from typing import TYPE_CHECKING, Any

from airflow_quota_provider.policy.backlog import Backlog, Entry
from airflow_quota_provider.policy.capacity import CohortTree, TreeUsage, Usage, ever_fits
from airflow_quota_provider.policy.decision import Decision, Rejection
from airflow_quota_provider.policy.errors import PolicyError
from airflow_quota_provider.policy.jobs import Host
from airflow_quota_provider.policy.ordering import queue_order

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from airflow_quota_provider.policy.config import Cohort, Quota
    from airflow_quota_provider.policy.jobs import Job
    from airflow_quota_provider.policy.state import State

MAX_TYPES = 5
"""GPU types per job queue: AWS Batch's capacity limits per quota share."""


class WhenCanBorrow(str, Enum):
    """Where a job can run on one type only by borrowing (Kueue's ``whenCanBorrow``)."""

    BORROW = "borrow"
    """Borrow on that type (Kueue's default)."""
    TRY_NEXT_TYPE = "try_next_type"
    """Try the next types for one where it fits within its quota; borrow only if none has room."""


class WhenCanPreempt(str, Enum):
    """Where a job can run on one type only by preempting (Kueue's ``whenCanPreempt``)."""

    TRY_NEXT_TYPE = "try_next_type"
    """Try the next types for one where it fits or borrows; preempt only if none has room (Kueue's default)."""
    PREEMPT = "preempt"
    """Preempt on that type."""


@dataclass(frozen=True)
class Fungibility:
    when_can_borrow: WhenCanBorrow = WhenCanBorrow.BORROW
    when_can_preempt: WhenCanPreempt = WhenCanPreempt.TRY_NEXT_TYPE


@dataclass(frozen=True)
class GpuType:
    """One GPU type of a typed job queue, as an untyped queue: the type's capacity of the queue and
    its quotas and cohorts with that type's capacities and limits."""

    name: str
    capacity: int
    quotas: tuple[Quota, ...]
    cohorts: tuple[Cohort, ...] = ()

    def quota(self, name: str) -> Quota:
        quota = self._by_name.get(name)
        if quota is None:
            raise PolicyError("quota", f"{name!r} is not one of {', '.join(q.name for q in self.quotas)}")
        return quota

    @cached_property
    def _by_name(self) -> dict[str, Quota]:
        return {quota.name: quota for quota in self.quotas}


# ------------------------------------------------------------------------------------ quota file


def parse_type_capacities(value: Any, path: str) -> dict[str, int]:
    """A typed job queue's ``capacity``: ``{type: GPUs}``, 1 to :data:`MAX_TYPES` types, in the
    queue's order of preference."""
    if not isinstance(value, dict) or not value:
        raise PolicyError(path, "expected a mapping {GPU type: GPUs}")
    if len(value) > MAX_TYPES:
        raise PolicyError(path, f"{len(value)} GPU types; at most {MAX_TYPES} (AWS Batch's capacity limits per share)")
    out = {}
    for name, gpus in value.items():
        _check_type_name(name, path)
        out[name] = _check_gpus(gpus, f"{path}.{name}", minimum=1)
    return out


def typed_value(value: Any, types: Mapping[str, int], path: str, *, what: str, percent: bool) -> dict[str, int | None]:
    """A quota's or cohort's typed field: ``{type: GPUs}`` (types left out: 0, or no limit for a
    limit), or, for a limit (``percent``), ``"N%"`` of each type's capacity as AWS Batch's borrow
    limit is. ``types``: the job queue's capacities (a limit's percentage is of the entry's own)."""
    if value is None:
        return {name: None for name in types} if percent else {name: 0 for name in types}
    if isinstance(value, str) and percent and value.endswith("%"):
        try:
            share = float(value[:-1])
        except ValueError:
            share = -1.0
        if not 0 <= share <= 1000:
            raise PolicyError(path, f"{value!r} is not a percentage from 0% to 1000%")
        return {name: int(capacity * share / 100) for name, capacity in types.items()}
    if not isinstance(value, dict):
        allowed = "a mapping {GPU type: GPUs} or a percentage such as \"50%\"" if percent else "a mapping {GPU type: GPUs}"
        raise PolicyError(path, f"{what} of a job queue with GPU types is {allowed}, got {value!r}")
    for name in value:
        if name not in types:
            raise PolicyError(f"{path}.{name}", f"{name!r} is not one of the job queue's GPU types {', '.join(types)}")
    return {name: (_check_gpus(value[name], f"{path}.{name}", minimum=0) if name in value else (None if percent else 0))
            for name in types}


def _check_type_name(name: Any, path: str) -> None:
    if not isinstance(name, str) or not name or len(name) > 64 or not all(c.isalnum() or c in "._-" for c in name):
        raise PolicyError(path, f"GPU type {name!r}: letters, digits, '.', '-' and '_', at most 64")


def _check_gpus(value: Any, path: str, *, minimum: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum or value > 2**31 - 1:
        raise PolicyError(path, f"{value!r} is not an integer from {minimum} to {2**31 - 1}")
    return value


def parse_fungibility(data: Any, path: str) -> Fungibility:
    from airflow_quota_provider.policy.fields import Fields

    if data is None:
        return Fungibility()
    fields = Fields(data, path)
    fungibility = Fungibility(
        when_can_borrow=WhenCanBorrow(fields.str("when_can_borrow", Fungibility.when_can_borrow, choices=WhenCanBorrow)),
        when_can_preempt=WhenCanPreempt(fields.str("when_can_preempt", Fungibility.when_can_preempt, choices=WhenCanPreempt)),
    )
    fields.done()
    return fungibility


def per_type(
    type_name: str, capacities: Mapping[str, Mapping[str, int | None]], entries: Sequence[Any], fields: Sequence[str]
) -> list[Any]:
    """The quotas (or cohorts) of one type: each entry with its typed ``fields`` set to that type's value
    (``capacities[entry name][field]`` maps type -> value)."""
    return [replace(entry, **{f: capacities[entry.name][f][type_name] for f in fields}) for entry in entries]


# ------------------------------------------------------------------------------------- deciding


def check_job_types(job: Job, types: Sequence[str]) -> str | None:
    """Why ``job`` can run on none of the queue's ``types``, or None."""
    if job.gpu_types and not any(t in types for t in job.gpu_types):
        asked = ", ".join(job.gpu_types)
        return f"gpu_type: {asked} is not one of this job queue's GPU types ({', '.join(types)})"
    return None


def charged_type(job: Job, types: Mapping[str, Any], host_types: Mapping[str, str | None]) -> str:
    """The one type of the queue's ``types`` (in order) that a running job counts on: its own
    ``gpu_type``, else the first of its hosts' types (``host_types``: host -> type) that is one of
    them, else the queue's first type (see the module's docstring)."""
    if job.gpu_type in types:
        return job.gpu_type
    for host in job.placed_on:
        host_type = host_types.get(host)
        if host_type in types:
            return host_type
    return next(iter(types))


def running_by_type(state: State) -> dict[str, Sequence[Job]]:
    """A typed job queue's running jobs by the type each counts on (:func:`charged_type`), in the
    queue's order of types. From a :class:`~.running.Running` the caller keeps (the simulator) whose
    jobs are all of the queue's types, the ones it keeps per type (:meth:`~.running.Running.of_type`),
    so that a cycle does not count every running job again."""
    from airflow_quota_provider.policy.running import Running  # it imports the config, which imports this

    kept = state.running
    if isinstance(kept, Running):
        by_type = {t.name: kept.of_type(t.name) for t in state.types}
        if sum(map(len, by_type.values())) == len(kept):
            return by_type
    running: dict[str, list[Job]] = {t.name: [] for t in state.types}
    host_types = {host.name: host.type for host in state.hosts or ()}
    for job in state.running:
        running[job.gpu_type if job.gpu_type in running else charged_type(job, running, host_types)].append(job)
    return running


_FIT, _BORROW, _PREEMPT = 0, 1, 2


def assign_types(
    state: State, now: float, running: Mapping[str, Sequence[Job]] | None = None
) -> tuple[dict[str, Backlog], list[Rejection]]:
    """Each type's waiting jobs for this cycle, and the jobs no type can ever hold. ``running``:
    :func:`running_by_type`'s, where the caller has it. From a :class:`~.backlog.Backlog` the caller
    keeps whose jobs each ask for one of the queue's types, the ones it keeps per type."""
    from airflow_quota_provider.policy.running import Running

    types = {t.name: t for t in state.types}
    order = list(types)
    pending = state.pending
    if isinstance(pending, Backlog):
        by_type = {name: pending.of_type(name) for name in order}
        if sum(map(len, by_type.values())) == len(pending):
            # Kept by the caller, and every job asks for one of the queue's types: that is its type
            # (the loop below would choose it too), and each type's jobs are kept in order already.
            return by_type, []
    fungibility = state.fungibility
    in_use: dict[str, dict[str, int]] = {name: {} for name in order}
    held: dict[str, str] = {}  # a preemptor waiting for its victims -> their type
    for name, jobs in (running_by_type(state) if running is None else running).items():
        if isinstance(jobs, Running):  # kept by the caller: its sums, and the few stopping jobs
            counts = in_use[name] = dict(jobs.in_use)
            for preemptor in jobs.preemptors():
                held[preemptor] = name
                for victim in jobs.stopping_for(preemptor):
                    counts[victim.quota] = counts.get(victim.quota, 0) + victim.gpus
            continue
        for job in jobs:
            in_use[name][job.quota] = in_use[name].get(job.quota, 0) + job.gpus
            if job.preempted_for is not None:
                held[job.preempted_for] = name
    usage = {name: _usage(types[name], in_use[name]) for name in order}
    queue_used = {name: sum(in_use[name].values()) for name in order}
    room = {t.name: t.capacity for t in state.types}  # what the type's live hosts hold (its hosts up)
    if state.hosts is not None:
        room = dict.fromkeys(order, 0)
        for host in state.hosts:
            if host.type in room and not host.down:
                room[host.type] += host.gpus
    assigned: dict[str, list[Entry]] = {name: [] for name in order}  # in queue order
    rejected: list[Rejection] = []
    most: dict[tuple[str, str], int] = {}
    modes: dict[str, dict[tuple[str, int], int]] = {name: {} for name in order}
    """Per type, :func:`_mode` by (quota, GPUs), until a job takes room there for those that could fit
    or borrow (taking room only worsens a mode): most waiting jobs share a few sizes, and once the
    types are full no job changes them."""
    stuck: dict[str, dict[tuple[str, int], int]] = {name: {} for name in order}  # the modes[type] at preempt
    unknown: dict[tuple[str, ...], str | None] = {}  # check_job_types per list of types asked
    verdicts: dict[tuple[str, str, int, int], int] = {}  # _verdict per (type, quota, GPUs, nodes)
    accepted = {_FIT}  # the modes in which a job takes a type without trying the next ones
    if fungibility.when_can_borrow == WhenCanBorrow.BORROW:
        accepted.add(_BORROW)
    if fungibility.when_can_preempt == WhenCanPreempt.PREEMPT:
        accepted.add(_PREEMPT)
    hosts: dict[str, list[int]] = {name: [] for name in order}  # each type's hosts' GPUs, largest first
    for host in state.hosts or ():
        if host.type in hosts:
            hosts[host.type].append(host.gpus)
    for sizes in hosts.values():
        sizes.sort(reverse=True)
    def _choose(job: Job, signature: tuple) -> str | None:
        """:func:`assign_types`'s choice for ``job``, counting its GPUs on the type if it takes room
        there; None when it is rejected."""
        if job.gpu_types:
            why = unknown.get(job.gpu_types, False)
            if why is False:
                why = unknown[job.gpu_types] = check_job_types(job, order)
            if why is not None:
                rejected.append(Rejection(job.id, why))
                return None
        choice, best = None, None
        size = (job.quota, job.gpus)
        for name in job.gpu_types or order:
            key = (name, job.quota, job.gpus, job.nodes)
            verdict = verdicts.get(key)
            if verdict is None:
                verdict = verdicts[key] = _verdict(types.get(name), job, most, hosts.get(name), state.hosts is not None)
            if verdict == _NEVER:
                continue
            if verdict == _UNKNOWN_QUOTA:
                break  # its type's own decision rejects it, naming the quotas
            known = modes[name]
            mode = known.get(size)
            if mode is None:
                mode = known[size] = _mode(job, usage[name], min(types[name].capacity, room[name]) - queue_used[name])
                if mode == _PREEMPT:
                    stuck[name][size] = mode
            if mode in accepted:
                choice = name
                break
            if best is None or mode < best[0]:
                best = (mode, name)
        if choice is None and best is not None:
            choice = best[1]
        if choice is None:  # too large for every type it may use: its first type's decision says why
            choice = next(n for n in job.gpu_types or order if n in types)
        elif modes[choice][size] != _PREEMPT:  # takes room (the loop looked it up)
            usage[choice].add(job.quota, job.gpus)
            queue_used[choice] += job.gpus
            modes[choice] = stuck[choice].copy()  # a mode at preempt stays so
            if _PREEMPT in accepted:
                settled.clear()
            return choice
        settled[signature] = choice
        return choice

    settled: dict[tuple, str] = {}
    """The type of a job that takes no room, by (quota, GPUs, nodes, types asked): once the types are
    full, a long backlog costs one look-up a job. Taking room only ever worsens a mode (fit, borrow,
    preempt, in that order), and a job that takes no room found every type it tried at preempt unless
    preempting is accepted: then its choice holds for the cycle. Where preempting is accepted, a type
    going from borrow to preempt can become the choice, so it holds until a job takes room."""
    if isinstance(pending, Backlog):
        ordered = pending.entries_in_queue_order()
    else:
        ordered = [(queue_order(job), job) for job in pending]
        ordered.sort(key=_KEY)  # by the key alone: comparing the pairs would compare each key twice
    for entry in ordered:
        job = entry[1]
        if held and job.id in held:
            assigned[held[job.id]].append(entry)
            continue
        signature = (job.quota, job.gpus, job.nodes, job.gpu_types)
        choice = settled.get(signature)
        if choice is None:
            choice = _choose(job, signature)
            if choice is None:
                continue
        assigned[choice].append(entry)
    return {name: Backlog.in_order(entries) for name, entries in assigned.items()}, rejected


_NEVER, _UNKNOWN_QUOTA, _MAYBE = 0, 1, 2
_KEY = itemgetter(0)


def _verdict(gpu_type: GpuType | None, job: Job, most: dict[tuple[str, str], int], sizes: list[int] | None,
             placed: bool) -> int:
    """Whether a type can never hold ``job`` (not one of the queue's, too large for its quota's share
    of it, or, ``placed`` on hosts, for its hosts: ``sizes``, their GPUs, largest first), has no such
    quota, or may hold it; ``most``: what each (type, quota) can ever hold, filled as asked."""
    if gpu_type is None:
        return _NEVER
    quota = gpu_type._by_name.get(job.quota)
    if quota is None:
        return _UNKNOWN_QUOTA
    key = (gpu_type.name, job.quota)
    if key not in most:
        most[key] = ever_fits(quota, gpu_type.quotas, gpu_type.capacity, gpu_type.cohorts)
    if job.gpus > most[key] or (placed and (len(sizes) < job.nodes or sizes[job.nodes - 1] < job.gpus_per_node)):
        return _NEVER
    return _MAYBE


def _mode(job: Job, usage: Usage, free: int) -> int:
    """Whether ``job`` fits on a type (``free`` GPUs there: its capacity, or its live hosts', less what
    runs) within its quota, by borrowing, or only by preempting (or waiting for a host)."""
    if job.gpus <= free:
        if usage.fits(job.quota, job.gpus, borrow=False):
            return _FIT
        if usage.fits(job.quota, job.gpus, borrow=True):
            return _BORROW
    return _PREEMPT


def _usage(gpu_type: GpuType, in_use: dict[str, int]) -> Usage:
    if not gpu_type.cohorts:
        return Usage(gpu_type.capacity, gpu_type.quotas, in_use)
    return TreeUsage(gpu_type.capacity, gpu_type.quotas, CohortTree(gpu_type.capacity, gpu_type.quotas, gpu_type.cohorts), in_use)


def decide_types(
    state: State, now: float, explain: bool, decide_one: Callable[[State, float, bool, str], Decision]
) -> Decision:
    """Decide a typed job queue: one untyped decision per type, on the jobs given that type
    (``decide_one``: its waiting jobs' reasons start with the type's name)."""
    from airflow_quota_provider.policy.running import Running
    from airflow_quota_provider.policy.state import State

    # Each type's Running once: the per-type decisions start from it, and assign_types from its sums.
    by_type = running_by_type(state)
    running = {name: Running.of(jobs) for name, jobs in by_type.items()}
    assigned, rejected = assign_types(state, now, running)
    hosts: dict[str, list[Host]] = {t.name: [] for t in state.types}
    stray: list[Host] = []  # hosts with none of the queue's types
    for host in state.hosts or ():
        (hosts[host.type] if host.type in hosts else stray).append(host)
    out = Decision(reject=rejected, placed=state.hosts is not None)
    for gpu_type in state.types:
        name = gpu_type.name
        sub = State(
            capacity=gpu_type.capacity, quotas=gpu_type.quotas, running=running[name],
            pending=assigned[name],
            hosts=None if state.hosts is None else tuple(hosts[name]) + _hosts_of_others(running[name], hosts[name]),
            cohorts=gpu_type.cohorts, gang_reservation_after_s=state.gang_reservation_after_s,
        )
        decision = decide_one(sub, now, explain, name)
        out.admit += decision.admit
        out.hosts.update(decision.hosts)
        out.types.update(dict.fromkeys(decision.admit, name))
        out.preempt += decision.preempt
        out.reject += [replace(r, reason=f"{name}: {r.reason}") for r in decision.reject]
        # Jobs kept per type (Running.of_type) are all of the type: none counted on it from elsewhere.
        note = _uncounted(name, () if isinstance(by_type[name], Running) else by_type[name], stray,
                          state.types) if decision.pending else ""
        if note:
            for pending in decision.pending:
                pending.reason += note
        out.pending += decision.pending
    return out


def _hosts_of_others(running: Sequence[Job], hosts: Sequence[Host]) -> tuple[Host, ...]:
    """The hosts of a type's running jobs that are not hosts of that type (a job counted on the type
    while on a host of another type or of none, :func:`charged_type`): down, so that nothing starts
    there and they are never victims there, each as large as those jobs hold there."""
    names = {host.name for host in hosts}
    others: dict[str, int] = {}
    for job in running:
        for host in job.placed_on:
            if host not in names:
                others[host] = others.get(host, 0) + job.gpus_per_node
    return tuple(Host(name, gpus, down=True) for name, gpus in others.items())


_NAMED = 3
"""Jobs or hosts a waiting job's reason names when it says what counts unlike the hosts show."""


def _uncounted(name: str, running: Sequence[Job], stray: Sequence[Host], types: Sequence[GpuType]) -> str:
    """What a waiting job's reason on type ``name`` adds: the running jobs counted on it without being
    of it, and the hosts that count for no type (empty when there are none)."""
    notes = []
    others = [job for job in running if job.gpu_type != name]
    if others:
        named = ", ".join(f"{job.id} (GPU type {job.gpu_type or 'none'})" for job in others[:_NAMED])
        more = f" and {len(others) - _NAMED} more" if len(others) > _NAMED else ""
        notes.append(f"counted on {name}: running jobs of none of this job queue's GPU types: {named}{more}")
    if stray:
        named = ", ".join(f"{host.name} (GPU type {host.type or 'none'})" for host in stray[:_NAMED])
        more = f" and {len(stray) - _NAMED} more" if len(stray) > _NAMED else ""
        listed = ", ".join(t.name for t in types)
        notes.append(f"counted for no GPU type: hosts of none of this job queue's GPU types ({listed}): {named}{more}")
    return "".join(f"; {note}" for note in notes)
