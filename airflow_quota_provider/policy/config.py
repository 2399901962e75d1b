"""The quota file: job queues, their shared quotas, and each quota's sharing and preemption rules.

Users write one YAML file (DESIGN §4); the executor, the simulator, the CLI and the AWS backend all
read it through :func:`load_quota_file`. The decision file's ``quotas`` entries carry the same fields
and are read by the same :func:`parse_quota`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from airflow_quota_provider.policy.capacity import CohortTree
from airflow_quota_provider.policy.documents import QUOTA_FILE_LIMITS, load_yaml
from airflow_quota_provider.policy.errors import PolicyError, shorten
from airflow_quota_provider.policy.fields import Fields, printable
from airflow_quota_provider.policy.types import Fungibility, GpuType, parse_fungibility, parse_type_capacities, typed_value
from airflow_quota_provider.policy.vocabulary import OnPreemptionLimit, Reclaim, Sharing, WithinQuota

MAX_QUOTAS_PER_QUEUE = 20  # AWS Batch's documented limit; a setting, not a design bound.
MAX_COHORT_DEPTH = 16
"""Levels of cohorts above a quota. Kueue sets none (KEP-79's stories have two or three levels); an
organisation's tree fits in 16, and every admission check walks a quota's levels up to the root."""

# A quota's name is also its Airflow pool name and its AWS quotaShareName: keep it valid for both.
# \Z, not $: "$" also matches before a final newline, and "team-x\n" is no pool name.
_NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_-]{0,127}\Z")


@dataclass(frozen=True)
class PreemptionPolicy:
    """Which running jobs a quota's waiting jobs may preempt (Kueue's policies)."""

    within_quota: WithinQuota = WithinQuota.LOWER_PRIORITY
    """Victims in the same quota."""
    reclaim: Reclaim = Reclaim.ANY
    """Victims in other quotas running above their capacity."""
    borrow_within: int | None = None
    """None (off), or the highest victim priority a job may preempt in other borrowing quotas while
    its own quota keeps borrowing."""


@dataclass(frozen=True)
class Quota:
    """One shared quota of a job queue: its capacity (nominal share) and its rules."""

    name: str
    capacity: int
    sharing: Sharing = Sharing.LEND_AND_BORROW
    borrow_limit: int | None = None
    lend_limit: int | None = None
    weight: float = 1.0
    max_priority: int | None = None
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    grace_period_s: float = 120.0
    min_runtime_s: float = 0.0
    spare_finishing_within_s: float = 0.0
    """A running job of this quota expected to end within this many seconds (or within its grace
    period, whichever is longer) is waited for, not preempted: stopping it would lose its work to free
    GPUs a little sooner; one past its expected end stays spared this much longer. 0: only the grace
    period, and none past its end. Acts only on jobs with an expected runtime."""
    preemption_delay_s: float = 0.0
    max_preemptions: int | None = None
    on_preemption_limit: OnPreemptionLimit = OnPreemptionLimit.FAIL
    teams: tuple[str, ...] = ()
    cohort: str | None = None
    """The cohort it belongs to (DESIGN §2, hierarchical cohorts); None: the job queue's root."""
    borrow_limit_percent: float | None = None
    """A quota of a job queue with GPU types whose ``borrow_limit`` the file gives as a percentage of
    each type's capacity: that percentage, as AWS Batch takes it (``borrow_limit`` is each type's
    GPUs, rounded down)."""

    # Cached: the quota arithmetic asks these on every check of a decision cycle.
    @cached_property
    def lends(self) -> bool:
        return self.sharing != Sharing.RESERVE

    @cached_property
    def borrows(self) -> bool:
        return self.sharing == Sharing.LEND_AND_BORROW

    @cached_property
    def private(self) -> int:
        """Capacity no other quota can ever use: all of it for ``reserve``, else what is not lendable."""
        if not self.lends:
            return self.capacity
        return self.capacity - (self.lend_limit if self.lend_limit is not None else self.capacity)

    def above_max_priority(self, priority: int) -> str | None:
        """Why a job of ``priority`` may not run on this quota (its ``max_priority``), or None: the
        policy rejects such a job and a priority change refuses such a value, in these words."""
        if self.max_priority is not None and priority > self.max_priority:
            return f"{priority} is above quota {self.name}'s max_priority {self.max_priority}"
        return None


MAX_GRACE_PERIOD_S = 86400.0
"""The longest grace period a quota or a job may give: a victim keeps its GPUs until it exits or
this long after SIGTERM, so a larger one (a typo, 1e12) would hold them for good."""


@dataclass(frozen=True)
class Cohort:
    """A group of quotas and cohorts in a job queue's tree (Kueue's hierarchical cohorts).

    It may own ``capacity`` for its subtree, which its members use before anyone outside may borrow
    it; ``borrow_limit`` caps what the subtree uses above what it owns and what its members lend into
    it, ``lend_limit`` what of that it lends to the rest of the tree (unset: no cap on either).
    """

    name: str
    parent: str | None = None
    """The cohort above it; None: a child of the job queue's root."""
    capacity: int = 0
    borrow_limit: int | None = None
    lend_limit: int | None = None


@dataclass(frozen=True)
class Queue:
    """A job queue: a pool of GPUs shared by up to ``max_quotas_per_queue`` quotas."""

    name: str
    capacity: int
    quotas: tuple[Quota, ...]
    capacity_unit: str | None = None
    cohorts: tuple[Cohort, ...] = ()
    """Empty: the quotas are flat, all children of the root."""
    types: tuple[GpuType, ...] = ()
    """GPU types (:mod:`.types`), in the queue's order of preference; then ``capacity``, ``quotas``'
    and ``cohorts``' capacities and limits are sums over the types. Empty: one untyped kind."""
    fungibility: Fungibility = Fungibility()
    gang_reservation_after_s: float | None = 86_400.0
    """A gang (a job of several hosts) that has waited this long for hosts, while fitting its quota,
    gets hosts kept for it until they drain (the one that has waited longest); None: never. By
    default a day (:data:`DEFAULT_GANG_RESERVATION_AFTER_S`)."""
    instance_types: dict[str, str] = field(default_factory=dict, hash=False)
    """GPU type -> the instance type AWS Batch counts it in (a quota share's capacity limits)."""
    gpu_hour_price: dict[str | None, float] = field(default_factory=dict, hash=False)
    """The chargeback price of one GPU-hour: GPU type -> price, or {None: price} for an untyped
    queue; empty: no price (usage reports show no cost)."""

    def quota(self, name: str) -> Quota:
        for quota in self.quotas:
            if quota.name == name:
                return quota
        raise PolicyError("quota", f"{name!r} is not one of {', '.join(q.name for q in self.quotas)}")


@dataclass(frozen=True)
class QuotaFile:
    """A parsed, validated quota file."""

    queues: tuple[Queue, ...]

    def quota(self, name: str) -> Quota:
        return self.queue_of(name).quota(name)

    def queue_of(self, quota_name: str) -> Queue:
        for queue in self.queues:
            if any(q.name == quota_name for q in queue.quotas):
                return queue
        names = ", ".join(q.name for queue in self.queues for q in queue.quotas)
        raise PolicyError("quota", f"{quota_name!r} is not one of {names}")

    def quota_for_team(self, team: str) -> str | None:
        """The quota a workload's team runs on: the one listing it in ``teams``, else the same name."""
        for queue in self.queues:
            for quota in queue.quotas:
                if team in quota.teams:
                    return quota.name
        for queue in self.queues:
            for quota in queue.quotas:
                if quota.name == team:
                    return quota.name
        return None


def parse_name(fields: Fields, key: str = "name") -> str:
    name = fields.raw(key)  # not Fields.str: the pattern is stricter, and its message says what is allowed
    if not isinstance(name, str) or not _NAME.match(name):
        raise PolicyError(
            fields.child(key),
            f"{shorten(name)} is not a valid name (letters, digits, '-' and '_', starting with a letter or digit, at most 128)",
        )
    return name


def parse_preemption(data: Any, path: str) -> PreemptionPolicy:
    fields = Fields({} if data is None else data, path)
    within = WithinQuota(fields.str("within_quota", PreemptionPolicy.within_quota, choices=WithinQuota))
    reclaim = Reclaim(fields.str("reclaim", PreemptionPolicy.reclaim, choices=Reclaim))
    borrow_within_data = fields.raw("borrow_within", None)
    borrow_within = None
    if borrow_within_data is not None:
        inner = Fields(borrow_within_data, fields.child("borrow_within"))
        borrow_within = inner.int("max_priority")
        inner.done()
    fields.done()
    return PreemptionPolicy(within_quota=within, reclaim=reclaim, borrow_within=borrow_within)


def parse_quota(data: Any, path: str) -> Quota:
    """One quota entry, as in the quota file's ``queues[].quotas[]`` and the decision file's ``quotas``."""
    fields = Fields(data, path)
    name = parse_name(fields)
    capacity = fields.int("capacity")
    sharing = Sharing(fields.str("sharing", Quota.sharing, choices=Sharing))
    borrow_limit = fields.int("borrow_limit", None, nullable=True)
    lend_limit = fields.int("lend_limit", None, nullable=True)
    weight = fields.number("weight", Quota.weight)
    max_priority = fields.int("max_priority", None, nullable=True)
    preemption = parse_preemption(fields.raw("preemption", None), fields.child("preemption"))
    quota = Quota(
        name=name,
        capacity=capacity,
        sharing=sharing,
        borrow_limit=borrow_limit,
        lend_limit=lend_limit,
        weight=weight,
        max_priority=max_priority,
        preemption=preemption,
        grace_period_s=fields.number("grace_period_s", Quota.grace_period_s, maximum=MAX_GRACE_PERIOD_S),
        min_runtime_s=fields.number("min_runtime_s", Quota.min_runtime_s),
        spare_finishing_within_s=fields.number("spare_finishing_within_s", Quota.spare_finishing_within_s),
        preemption_delay_s=fields.number("preemption_delay_s", Quota.preemption_delay_s),
        max_preemptions=fields.int("max_preemptions", None, nullable=True),
        on_preemption_limit=OnPreemptionLimit(
            fields.str("on_preemption_limit", Quota.on_preemption_limit, choices=OnPreemptionLimit)
        ),
        teams=tuple(_parse_team(item, item_path) for item, item_path in fields.list("teams", [])),
        cohort=fields.str("cohort", None),
    )
    fields.done()
    if weight <= 0:
        raise PolicyError(fields.child("weight"), f"{weight} must be above 0")
    if borrow_limit is not None and not quota.borrows:
        raise PolicyError(fields.child("borrow_limit"), f"only allowed with sharing lend_and_borrow, not {sharing}")
    if preemption.borrow_within is not None and not quota.borrows:
        raise PolicyError(
            fields.child("preemption.borrow_within"), f"only allowed with sharing lend_and_borrow, not {sharing}"
        )
    if lend_limit is not None:
        if not quota.lends:
            raise PolicyError(fields.child("lend_limit"), "not allowed with sharing reserve (it never lends)")
        if lend_limit > capacity:
            raise PolicyError(fields.child("lend_limit"), f"{lend_limit} is above the quota's capacity {capacity}")
    return quota


def _parse_team(item: Any, path: str) -> str:
    if not isinstance(item, str) or not item:
        raise PolicyError(path, f"expected a team name, got {shorten(item)}")
    return printable(item, path)


def check_quotas(quotas: tuple[Quota, ...], capacity: int, path: str, *, max_quotas: int) -> None:
    """Rules over a queue's quotas as a whole: count, unique names, capacities within the queue."""
    if not quotas:
        raise PolicyError(path, "a job queue needs at least one quota")
    if len(quotas) > max_quotas:
        raise PolicyError(path, f"{len(quotas)} quotas, more than the limit of {max_quotas} per job queue")
    seen: set[str] = set()
    for index, quota in enumerate(quotas):
        if quota.name in seen:
            raise PolicyError(f"{path}[{index}].name", f"duplicate quota name {quota.name!r}")
        seen.add(quota.name)
    total = sum(q.capacity for q in quotas)
    if total > capacity:
        raise PolicyError(path, f"quota capacities sum to {total}, above the job queue's capacity {capacity}")


def parse_cohort(data: Any, path: str) -> Cohort:
    """One cohort entry, as in the quota file's ``queues[].cohorts[]`` and the decision file's ``cohorts``."""
    fields = Fields(data, path)
    cohort = Cohort(
        name=parse_name(fields),
        parent=fields.str("parent", None),
        capacity=fields.int("capacity", 0),
        borrow_limit=fields.int("borrow_limit", None, nullable=True),
        lend_limit=fields.int("lend_limit", None, nullable=True),
    )
    fields.done()
    return cohort


def check_cohorts(cohorts: tuple[Cohort, ...], quotas: tuple[Quota, ...], capacity: int, path: str) -> None:
    """Rules over a queue's tree: names, parents that exist and form no cycle, at most
    :data:`MAX_COHORT_DEPTH` levels, capacities within the queue, and lend limits the subtree can
    honour. ``path`` is the queue's (empty for a decision file). Linear in the number of cohorts: a
    hostile file of ten thousand levels is refused at once."""
    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    quota_names = {quota.name for quota in quotas}
    names: dict[str, int] = {}
    for index, cohort in enumerate(cohorts):
        if cohort.name in names or cohort.name in quota_names:
            what = "cohort" if cohort.name in names else "name, also a quota's,"
            raise PolicyError(at(f"cohorts[{index}].name"), f"duplicate {what} {cohort.name!r}")
        names[cohort.name] = index
    allowed = ", ".join(names) or "none (the file has no cohorts)"
    # Every parent first: the walk up the tree below may then follow any parent it meets.
    for index, cohort in enumerate(cohorts):
        if cohort.parent is not None and cohort.parent not in names:
            raise PolicyError(
                at(f"cohorts[{index}].parent"),
                f"{cohort.parent!r}, the parent of cohort {cohort.name!r}, is not one of {allowed}",
            )
    depths = _cohort_depths(cohorts, names, at)
    for index, depth in enumerate(depths):
        if depth > MAX_COHORT_DEPTH:
            raise PolicyError(
                at(f"cohorts[{index}].parent"),
                f"cohort {cohorts[index].name!r} is {depth} levels deep, beyond the bound of "
                f"{MAX_COHORT_DEPTH} levels of cohorts",
            )
    for index, quota in enumerate(quotas):
        if quota.cohort is not None and quota.cohort not in names:
            raise PolicyError(at(f"quotas[{index}].cohort"), f"{quota.cohort!r} is not one of {allowed}")
    if not cohorts:
        return
    owned = sum(q.capacity for q in quotas) + sum(c.capacity for c in cohorts)
    if owned > capacity:
        raise PolicyError(
            at("cohorts"), f"quota and cohort capacities sum to {owned}, above the job queue's capacity {capacity}"
        )
    tree = CohortTree(capacity, quotas, cohorts)
    for index, cohort in enumerate(cohorts):
        if not tree.members(index):
            raise PolicyError(at(f"cohorts[{index}].name"), f"cohort {cohort.name!r} has no quota under it")
        lendable = tree.sq[index]
        if cohort.lend_limit is not None and cohort.lend_limit > lendable:
            raise PolicyError(
                at(f"cohorts[{index}].lend_limit"),
                f"{cohort.lend_limit} is above the {lendable} GPUs cohort {cohort.name} can lend "
                f"(its capacity {cohort.capacity} and what its members lend into it)",
            )


def _cohort_depths(cohorts: tuple[Cohort, ...], names: dict[str, int], at: Callable[[str], str]) -> list[int]:
    """Each cohort's level (1: under the queue's root), each walk stopping at a cohort already
    measured, so the whole is linear; a cycle is refused at its first cohort in the file's order."""
    depths: list[int] = [0] * len(cohorts)  # 0: not measured yet
    for start in range(len(cohorts)):
        walk: list[int] = []
        on_walk: dict[int, int] = {}
        node: int | None = start
        while node is not None and not depths[node]:
            if node in on_walk:
                cycle = walk[on_walk[node]:]
                first = cycle.index(min(cycle))
                cycle = cycle[first:] + cycle[:first]
                shown = " -> ".join(cohorts[i].name for i in [*cycle, cycle[0]])
                raise PolicyError(at(f"cohorts[{cycle[0]}].parent"), f"cycle: {shown}")
            on_walk[node] = len(walk)
            walk.append(node)
            parent = cohorts[node].parent
            node = None if parent is None else names[parent]
        depth = 0 if node is None else depths[node]
        for node in reversed(walk):
            depth += 1
            depths[node] = depth
    return depths


def parse_quota_file(data: Any, *, max_quotas_per_queue: int = MAX_QUOTAS_PER_QUEUE) -> QuotaFile:
    """Validate a parsed quota file; every error names the field path and the allowed values."""
    fields = Fields(data, "")
    queues = []
    quota_names: dict[str, str] = {}
    team_paths: dict[str, str] = {}
    items = fields.list("queues")
    if not items:
        raise PolicyError("queues", "at least one job queue is required")
    for item, path in items:
        queue_fields = Fields(item, path)
        name = parse_name(queue_fields)
        capacity_unit = queue_fields.str("capacity_unit", None)
        capacity, quotas, cohorts, types, fungibility = parse_queue_body(queue_fields, path, max_quotas=max_quotas_per_queue)
        instance_types = _parse_instance_types(queue_fields, types)
        gpu_hour_price = _parse_gpu_hour_price(queue_fields, types)
        gang_reservation_after_s = parse_gang_reservation(queue_fields)
        queue_fields.done()
        if any(q.name == name for q in queues):
            raise PolicyError(queue_fields.child("name"), f"duplicate job queue name {name!r}")
        for index, quota in enumerate(quotas):
            quota_path = f"{queue_fields.child('quotas')}[{index}]"
            # A quota is also an Airflow pool, so its name is unique across queues.
            if quota.name in quota_names:
                raise PolicyError(f"{quota_path}.name", f"quota {quota.name!r} is already defined at {quota_names[quota.name]}")
            quota_names[quota.name] = quota_path
            for team in quota.teams:
                if team in team_paths:
                    raise PolicyError(f"{quota_path}.teams", f"team {team!r} is already mapped at {team_paths[team]}")
                team_paths[team] = quota_path
        queues.append(Queue(name=name, capacity=capacity, quotas=quotas, capacity_unit=capacity_unit, cohorts=cohorts,
                            types=types, fungibility=fungibility, instance_types=instance_types,
                            gpu_hour_price=gpu_hour_price, gang_reservation_after_s=gang_reservation_after_s))
    fields.done()
    return QuotaFile(queues=tuple(queues))


def parse_queue_body(
    fields: Fields, path: str, *, max_quotas: int
) -> tuple[int, tuple[Quota, ...], tuple[Cohort, ...], tuple[GpuType, ...], Fungibility]:
    """A job queue's ``capacity``, ``quotas`` and ``cohorts`` (a quota file's queue, or a decision
    file, ``path`` empty), checked as a whole. A ``capacity`` mapping ``{type: GPUs}`` makes a queue with
    GPU types (:mod:`.types`): its quotas' and cohorts' ``capacity`` are mappings too, their limits
    mappings or a percentage of each type's capacity, and ``fungibility`` says how a job chooses."""
    def at(key: str) -> str:
        return f"{path}.{key}" if path else key

    raw = fields.raw("capacity", None)
    if not isinstance(raw, dict):
        capacity = fields.int("capacity", minimum=1)
        quotas = tuple(parse_quota(q, q_path) for q, q_path in fields.list("quotas"))
        cohorts = tuple(parse_cohort(c, c_path) for c, c_path in fields.list("cohorts", []))
        if fields.has("fungibility"):
            raise PolicyError(fields.child("fungibility"), "only for a job queue whose capacity is per GPU type")
        check_quotas(quotas, capacity, at("quotas"), max_quotas=max_quotas)
        check_cohorts(cohorts, quotas, capacity, path)
        return capacity, quotas, cohorts, (), Fungibility()
    capacities = parse_type_capacities(raw, fields.child("capacity"))
    fungibility = parse_fungibility(fields.raw("fungibility", None), fields.child("fungibility"))
    quotas_by_type, quotas = _typed_entries(fields.list("quotas"), capacities, parse_quota, "quota")
    cohorts_by_type, cohorts = _typed_entries(fields.list("cohorts", []), capacities, parse_cohort, "cohort")
    types = []
    for name, capacity in capacities.items():
        try:
            check_quotas(quotas_by_type[name], capacity, at("quotas"), max_quotas=max_quotas)
            check_cohorts(cohorts_by_type[name], quotas_by_type[name], capacity, path)
        except PolicyError as e:
            raise PolicyError(e.path, f"{e.message} (GPU type {name})") from None
        types.append(GpuType(name, capacity, quotas_by_type[name], cohorts_by_type[name]))
    total = sum(capacities.values())
    check_quotas(quotas, total, at("quotas"), max_quotas=max_quotas)
    check_cohorts(cohorts, quotas, total, path)
    return total, quotas, cohorts, tuple(types), fungibility


MAX_GANG_RESERVATION_AFTER_S = 30 * 86_400.0
"""The most ``gang_reservation_after_s`` may be: a month (beyond, say null: never)."""
DEFAULT_GANG_RESERVATION_AFTER_S = Queue.gang_reservation_after_s
"""A day, so that no gang waits behind smaller jobs forever unless a quota file says null. On the ITP
replay over four priority draws it was the setting tried that met both of issue 32's wait goals on
their mean, where 12 h cost the other jobs more (docs/benchmarks.md)."""


def parse_gang_reservation(fields: Fields) -> float | None:
    """A job queue's ``gang_reservation_after_s`` (a quota file's queue, or a decision file): absent,
    :data:`DEFAULT_GANG_RESERVATION_AFTER_S`; null, never."""
    return fields.number("gang_reservation_after_s", DEFAULT_GANG_RESERVATION_AFTER_S, nullable=True,
                         maximum=MAX_GANG_RESERVATION_AFTER_S)


def _parse_instance_types(fields: Fields, types: tuple[GpuType, ...]) -> dict[str, str]:
    """A job queue's ``instance_types``: the instance type AWS Batch counts each GPU type in."""
    raw = fields.raw("instance_types", None)
    if raw is None:
        return {}
    path = fields.child("instance_types")
    names = [t.name for t in types]
    if not names:
        raise PolicyError(path, "only for a job queue whose capacity is per GPU type")
    if not isinstance(raw, dict):
        raise PolicyError(path, f"expected a mapping {{GPU type: instance type}}, got {shorten(raw)}")
    for key, value in raw.items():
        if key not in names:
            raise PolicyError(f"{path}.{key}", f"{key!r} is not one of the job queue's GPU types {', '.join(names)}")
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(f"{path}.{key}", f"expected an instance type such as ml.p5.48xlarge, got {shorten(value)}")
    return dict(raw)


def _parse_gpu_hour_price(fields: Fields, types: tuple[GpuType, ...]) -> dict[str | None, float]:
    """A job queue's ``gpu_hour_price``: a number (an untyped queue), or one per GPU type, each a
    finite number from 0 (a typed queue prices every type: a cost summed over some would mislead)."""
    if not fields.has("gpu_hour_price"):
        return {}
    if not types:
        return {None: fields.number("gpu_hour_price")}
    path = fields.child("gpu_hour_price")
    raw = fields.raw("gpu_hour_price")
    names = [t.name for t in types]
    if not isinstance(raw, dict):
        raise PolicyError(
            path, f"expected a mapping {{GPU type: price per GPU-hour}} for the GPU types {', '.join(names)}, got {shorten(raw)}"
        )
    for key in raw:
        if key not in names:
            raise PolicyError(f"{path}.{key}", f"{key!r} is not one of the job queue's GPU types {', '.join(names)}")
    missing = [name for name in names if name not in raw]
    if missing:
        raise PolicyError(path, f"no price for GPU type {', '.join(missing)}; every one of {', '.join(names)} needs one")
    prices = Fields(raw, path)
    return {name: prices.number(name) for name in names}


def _typed_entries(items: list[tuple[Any, str]], capacities: dict[str, int], parse: Callable, what: str):
    """Quotas (or cohorts) of a queue with GPU types: per type, each entry with that type's capacity
    and limits; and each entry with their sums (what is shown where types do not matter)."""
    by_type: dict[str, list] = {name: [] for name in capacities}
    summed = []
    for item, item_path in items:
        if not isinstance(item, dict):
            parse(item, item_path)  # raises, naming what is wrong
        own = typed_value(item.get("capacity"), capacities, f"{item_path}.capacity", what=f"a {what}'s capacity", percent=False)
        limits = {
            key: typed_value(item.get(key), own, f"{item_path}.{key}", what=f"a {what}'s {key}", percent=True)
            for key in ("borrow_limit", "lend_limit")
        }
        for name in capacities:
            typed = {**item, "capacity": own[name], **{key: limit[name] for key, limit in limits.items()}}
            try:
                by_type[name].append(parse(typed, item_path))
            except PolicyError as e:
                raise PolicyError(e.path, f"{e.message} (GPU type {name})") from None
        sums = {key: None if None in limit.values() else sum(limit.values()) for key, limit in limits.items()}
        entry = parse({**item, "capacity": sum(own.values()), **sums}, item_path)
        percent = item.get("borrow_limit")
        if isinstance(percent, str) and isinstance(entry, Quota):  # typed_value checked it: "N%"
            entry = replace(entry, borrow_limit_percent=float(percent[:-1]))
        summed.append(entry)
    return {name: tuple(entries) for name, entries in by_type.items()}, tuple(summed)


def load_quota_file(path: str | Path, *, max_quotas_per_queue: int = MAX_QUOTAS_PER_QUEUE) -> QuotaFile:
    """Read and validate a YAML quota file. Unreadable, oversized or malformed YAML is a
    :class:`PolicyError` too (the bounds: :mod:`~airflow_quota_provider.policy.documents`)."""
    data = load_yaml(path, QUOTA_FILE_LIMITS, what="quota file")
    return parse_quota_file(data, max_quotas_per_queue=max_quotas_per_queue)


def queue_to_dict(queue: Queue) -> dict[str, Any]:
    """A job queue in the quota file's form, GPU types and prices included (the inverse of
    :func:`parse_quota_file`'s for one queue): what the audit log records of the file in force."""
    out: dict[str, Any] = {"name": queue.name, "capacity": queue.capacity}
    if queue.capacity_unit:
        out["capacity_unit"] = queue.capacity_unit
    out["quotas"] = [quota_to_dict(quota) for quota in queue.quotas]
    out["cohorts"] = [cohort_to_dict(cohort) for cohort in queue.cohorts]
    if queue.types:
        out["capacity"] = {t.name: t.capacity for t in queue.types}
        for key, per_type in (("quotas", [t.quotas for t in queue.types]), ("cohorts", [t.cohorts for t in queue.types])):
            for i, entry in enumerate(out[key]):
                for name in ("capacity", "borrow_limit", "lend_limit"):
                    values = {t.name: getattr(entries[i], name) for t, entries in zip(queue.types, per_type)}
                    values = {t: v for t, v in values.items() if v is not None}
                    entry[name] = values or None
        for entry, quota in zip(out["quotas"], queue.quotas):
            if quota.borrow_limit_percent is not None:
                entry["borrow_limit"] = f"{quota.borrow_limit_percent!r}%"
        out["fungibility"] = {"when_can_borrow": str(queue.fungibility.when_can_borrow.value),
                              "when_can_preempt": str(queue.fungibility.when_can_preempt.value)}
        if queue.instance_types:
            out["instance_types"] = dict(queue.instance_types)
    out["gang_reservation_after_s"] = queue.gang_reservation_after_s  # null (never) is not the default
    if queue.gpu_hour_price:
        out["gpu_hour_price"] = dict(queue.gpu_hour_price) if queue.types else queue.gpu_hour_price[None]
    return out


def quota_to_dict(quota: Quota) -> dict[str, Any]:
    """A quota in the decision file's form (the inverse of :func:`parse_quota`)."""
    preemption = quota.preemption
    return {
        "name": quota.name,
        "capacity": quota.capacity,
        "sharing": str(quota.sharing),  # plain strings: PyYAML's safe dumper refuses str subclasses
        "borrow_limit": quota.borrow_limit,
        "lend_limit": quota.lend_limit,
        "weight": quota.weight,
        "max_priority": quota.max_priority,
        "preemption": {
            "within_quota": str(preemption.within_quota),
            "reclaim": str(preemption.reclaim),
            "borrow_within": None if preemption.borrow_within is None else {"max_priority": preemption.borrow_within},
        },
        "grace_period_s": quota.grace_period_s,
        "min_runtime_s": quota.min_runtime_s,
        "spare_finishing_within_s": quota.spare_finishing_within_s,
        "preemption_delay_s": quota.preemption_delay_s,
        "max_preemptions": quota.max_preemptions,
        "on_preemption_limit": str(quota.on_preemption_limit),
        "teams": list(quota.teams),
        **({"cohort": quota.cohort} if quota.cohort is not None else {}),
    }


def cohort_to_dict(cohort: Cohort) -> dict[str, Any]:
    """A cohort in the decision file's form (the inverse of :func:`parse_cohort`)."""
    return {
        "name": cohort.name,
        "parent": cohort.parent,
        "capacity": cohort.capacity,
        "borrow_limit": cohort.borrow_limit,
        "lend_limit": cohort.lend_limit,
    }
