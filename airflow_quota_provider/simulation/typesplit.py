"""``--types``: replay an untyped quota file and trace as a fleet of several GPU types (issue 33).

``h100=0.25,a100=0.5,l4=0.25`` splits every job queue's capacity by those shares, in that order of
preference (on hosts: whole hosts per type, so a host holds one type), and each quota's and cohort's
capacity and limits in proportion to what each type got; a quota's parts add up to its capacity.
The typed file goes through the quota-file parser like one written by hand, so it is checked the same.
Each job without a ``gpu_type`` in the trace draws one with the same shares (one draw per job, seeded,
as the priority classes are drawn), so jobs are bound to a type as users who ask for one are, and a
type's capacity is what it can hold.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any
from dataclasses import replace

from airflow_quota_provider.policy import PolicyError, QuotaFile
from airflow_quota_provider.policy.config import cohort_to_dict, parse_quota_file, quota_to_dict
from airflow_quota_provider.policy.types import MAX_TYPES
from airflow_quota_provider.simulation.workload import InputError, TraceJob

if TYPE_CHECKING:
    from airflow_quota_provider.policy import Cohort, Quota

FLAG = "--types"


def parse_type_shares(text: str) -> dict[str, float]:
    """``NAME=SHARE,...``: 1 to :data:`MAX_TYPES` GPU types in order of preference, shares summing to 1."""
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, share = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(FLAG, f"{part.strip()!r}: expected NAME=SHARE, e.g. h100=0.25,a100=0.75")
        if name in shares:
            raise InputError(FLAG, f"GPU type {name!r} given twice")
        try:
            value = float(share)
        except ValueError:
            value = -1.0
        if not 0 < value <= 1:
            raise InputError(FLAG, f"{name}: share {share.strip()!r} is not a number above 0 and at most 1")
        shares[name] = value
    if len(shares) > MAX_TYPES:
        raise InputError(FLAG, f"{len(shares)} GPU types; at most {MAX_TYPES}")
    if abs(sum(shares.values()) - 1) > 1e-6:
        raise InputError(FLAG, f"shares add up to {sum(shares.values()):g}; they must add up to 1")
    return shares


def _apportion(total: int, weights: Sequence[float], room: Sequence[int] | None = None) -> list[int]:
    """``total`` split in proportion to ``weights`` by largest remainder, each part within ``room``
    (a part that would overflow its room gives the unit to the next largest remainder)."""
    scale = sum(weights)
    exact = [total * w / scale if scale else 0.0 for w in weights]
    parts = [int(x) for x in exact]
    if room is not None:
        parts = [min(p, r) for p, r in zip(parts, room)]
    order = sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))
    left = total - sum(parts)
    while left > 0:
        progressed = False
        for i in order:
            if left and (room is None or parts[i] < room[i]):
                parts[i] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise InputError(FLAG, f"cannot split {total} GPUs by the shares")
    return parts


def split_types(quota_file: QuotaFile, shares: dict[str, float], gpus_per_host: int | None = None) -> QuotaFile:
    """``quota_file`` with each (untyped) job queue's capacity split by ``shares``: whole hosts of
    ``gpus_per_host`` per type when given. Quotas and cohorts get each type's fraction of their own
    capacity and limits; a type's quotas never add up to more than its capacity."""
    names = list(shares)
    queues = []
    for queue in quota_file.queues:
        if queue.types:
            raise InputError(FLAG, f"job queue {queue.name} already has GPU types ({', '.join(t.name for t in queue.types)})")
        if gpus_per_host:
            hosts = _apportion(queue.capacity // gpus_per_host, list(shares.values()))
            capacity = [h * gpus_per_host for h in hosts]
        else:
            capacity = _apportion(queue.capacity, list(shares.values()))
        if 0 in capacity:
            empty = names[capacity.index(0)]
            raise InputError(FLAG, f"GPU type {empty} gets no GPUs of job queue {queue.name} ({queue.capacity} GPUs"
                             + (f" on hosts of {gpus_per_host}" if gpus_per_host else "") + "): raise its share")
        fractions = [c / queue.capacity for c in capacity]
        room = list(capacity)  # what the type has left to give its quotas, then its cohorts
        quotas = _split_entries(queue.quotas, quota_to_dict, fractions, room, names)
        cohorts = _split_entries(queue.cohorts, cohort_to_dict, fractions, room, names)
        queues.append({"name": queue.name, "capacity": dict(zip(names, capacity)), "quotas": quotas,
                       **({"cohorts": cohorts} if cohorts else {}),
                       **({"capacity_unit": queue.capacity_unit} if queue.capacity_unit else {})})
    try:
        return parse_quota_file({"queues": queues})
    except PolicyError as error:
        raise InputError(FLAG, f"the split quota file is not valid: {error}") from None


def _split_entries(entries: Sequence[Quota | Cohort], to_dict: Callable[[Any], dict[str, Any]], fractions: list[float],
                   room: list[int], names: list[str]) -> list[dict[str, Any]]:
    """Quotas (or cohorts) in the quota file's form with a capacity and limits per type, each type's
    part taken from ``room`` (left for the next)."""
    out = []
    for entry in entries:
        parts = _apportion(entry.capacity, fractions, room)
        room[:] = [r - p for r, p in zip(room, parts)]
        out.append({**to_dict(entry), "capacity": dict(zip(names, parts)), **_limits(entry, parts, fractions, names)})
    return out


def _limits(entry: Quota | Cohort, parts: list[int], fractions: list[float], names: list[str]) -> dict[str, Any]:
    """A quota's or cohort's limits per type: what it lends in proportion to its own parts (never more
    than a part), what it borrows in proportion to the types' capacities."""
    out: dict[str, Any] = {}
    if entry.lend_limit is not None:
        out["lend_limit"] = dict(zip(names, _apportion(min(entry.lend_limit, sum(parts)), parts, parts)))
    if entry.borrow_limit is not None:
        out["borrow_limit"] = dict(zip(names, _apportion(entry.borrow_limit, fractions)))
    return out


def draw_gpu_types(jobs: Sequence[TraceJob], shares: dict[str, float], seed: int) -> list[TraceJob]:
    """Jobs without a ``gpu_type`` draw one by ``shares`` (one draw per job with
    ``random.Random(seed)`` in trace order, whether or not it carries one, so a job's type does not
    depend on the others')."""
    rng = random.Random(seed)
    names, weights = list(shares), list(shares.values())
    out = []
    for job in jobs:
        drawn = rng.choices(names, weights)[0]
        out.append(job if job.gpu_types else replace(job, gpu_types=(drawn,)))
    return out


def with_types(quota_file: QuotaFile, jobs: Sequence[TraceJob], text: str, gpus_per_host: int | None,
               seed: int) -> tuple[QuotaFile, list[TraceJob]]:
    """The quota file and jobs ``--types text`` makes (see the module); the one entry of the command
    line and the benchmarks."""
    shares = parse_type_shares(text)
    return split_types(quota_file, shares, gpus_per_host), draw_gpu_types(jobs, shares, seed)
