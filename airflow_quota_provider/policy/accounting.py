"""Usage accounting: who used, borrowed, lent, left idle and lost how many GPU-seconds.

The one home of these definitions: the live accounting (the audit log, ``airflow quota usage``,
``GET /quota/api/usage``, the daily roll-up) and the simulator's report both call this module.

At one moment, for a quota of capacity ``C`` whose jobs hold ``u`` GPUs:

- ``used_within`` = ``min(u, C)``: GPUs it uses of its own capacity;
- ``borrowed`` = ``u - C`` when positive: GPUs it holds above its capacity;
- ``lent``: GPUs of its idle capacity that borrowers hold. Borrowers draw on the common pool first,
  then on the lenders in proportion to what each lends (``lendable``), exactly (fractions of a GPU
  over time: the status page rounds the same split to whole GPUs, :meth:`~.capacity.Usage.lent`).
  With cohorts, level by level as :meth:`~.capacity.TreeUsage.lent` splits whole GPUs;
- ``idle`` = ``C - used_within - lent``.

Over a period each figure is integrated over time, in GPU-seconds, so per quota and period
``used_within + lent + idle = C x T``. Per job queue, what borrowers hold that no quota lent was
*drawn from the pool* (the GPUs no quota owns: the common pool and cohorts' own capacity), so
``sum(borrowed) = sum(lent) + pool_drawn``.

``lost`` is work lost to preemption: for a hold that ended by preemption, its GPUs times the time
from its last checkpoint (its start when it had none) to the moment its GPUs were freed (the grace
period counts; the simulator's ``lost_gpu_hours`` since its first version).

Per DAG (and per DAG owner) a quota's ``used_within`` and ``borrowed`` at each moment are shared by
its running jobs in proportion to their GPUs: a quota above its capacity borrows on behalf of all
its jobs alike, whichever started first. ``lent`` and ``idle`` belong to quotas, not to DAGs.

Periods are cut at their boundaries: a hold across midnight counts in both days.

A job queue with GPU types is accounted per type, each type as its own untyped job queue (its
:class:`~.types.GpuType`'s capacities), since an H100's GPU-hour is not an L4's: per quota, type and
period ``used_within + lent + idle = C_type x T``. A quota's figures are the sums over its types (an
untyped queue's are exactly what they were before types); the per-type figures are keyed
additionally by the type (None in an untyped queue). A hold carries the type it ran on; one without
(recorded before holds had types) is charged to the queue's first type, the one an untyped job tries
first, and one of a type the queue no longer has is left out, as a removed quota's is.

Chargeback prices what a quota's jobs held, ``used_within + borrowed`` (:data:`CHARGED`), at the
queue's ``gpu_hour_price`` of the type (:func:`costs`); lent and idle GPUs are not charged.

Over time the quota file changes. :func:`account_history` charges each moment with the job queues
in force then (a :class:`Config` each, from the moment it was loaded until the next), so a quota is
charged capacity, and so idle GPU-seconds, only while a quota file in force has it: from when it
first appeared, never before the first configuration (the install's start).
"""

from __future__ import annotations

import bisect
import gc
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple

from airflow_quota_provider.policy.capacity import lendable, usage_for
from airflow_quota_provider.policy.config import Queue
from airflow_quota_provider.policy.state import State

KINDS = ("used_within", "borrowed", "lent", "idle", "lost")
"""The kinds of GPU-seconds a quota is charged with, in report order."""
CHARGED = ("used_within", "borrowed")
"""The kinds a price turns into cost: the GPUs a quota's (or DAG's) jobs held, within its capacity or
above it (``lost`` is part of them, not more)."""

DAY_S = 86400.0


def within(capacity: int, used: int) -> int:
    """GPUs a quota holding ``used`` uses of its own ``capacity``."""
    return used if used < capacity else capacity


def lost_span(start: float, end: float, last_checkpoint_at: float | None) -> tuple[float, float]:
    """The stretch of a preempted hold whose work is lost: from its last checkpoint (or start) to its end."""
    since = start if last_checkpoint_at is None or last_checkpoint_at < start else last_checkpoint_at
    return (since if since < end else end, end)


class Hold(NamedTuple):
    """One attempt of a job holding GPUs, from ``start`` until ``end`` (None: still holding)."""

    job: str
    quota: str
    gpus: int
    start: float
    end: float | None = None
    dag_id: str | None = None
    preempted: bool = False
    """It ended by preemption: its work since ``last_checkpoint_at`` is lost."""
    last_checkpoint_at: float | None = None
    gpu_type: str | None = None
    """The GPU type it ran on (a job queue with GPU types); None: untyped."""


@dataclass(slots=True)
class Figures:
    """GPU-seconds of one quota (or one DAG on one quota) in one period; ``capacity_s`` = C x T."""

    capacity_s: float = 0.0
    used_within: float = 0.0
    borrowed: float = 0.0
    lent: float = 0.0
    idle: float = 0.0
    lost: float = 0.0

    def add(self, other: Figures) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass
class PoolFigures:
    """GPU-seconds of one job queue's pool (GPUs no quota owns) in one period."""

    capacity_s: float = 0.0
    drawn: float = 0.0
    """What borrowers held of it: the part of their ``borrowed`` no quota lent."""


@dataclass
class Account:
    """The figures of a period list, each keyed by its period's start."""

    periods: list[tuple[float, float]]
    quotas: dict[tuple[float, str], Figures]
    """(period start, quota) -> its figures."""
    dags: dict[tuple[float, str, str | None], Figures]
    """(period start, quota, dag_id) -> the DAG's share of the quota's used_within, borrowed, lost."""
    pools: dict[tuple[float, str], PoolFigures]
    """(period start, job queue) -> its pool's figures (summed over GPU types)."""
    quota_types: dict[tuple[float, str, str | None], Figures] = field(default_factory=dict)
    """(period start, quota, GPU type) -> its figures on that type (None: an untyped queue's quota);
    ``quotas`` holds their sums over the types."""
    dag_types: dict[tuple[float, str, str | None, str | None], Figures] = field(default_factory=dict)
    """(period start, quota, GPU type, dag_id) -> the DAG's share on that type; ``dags`` holds the sums."""


class Event(NamedTuple):
    """What accounting reads of one audit event (``quota_event``), oldest first."""

    at: float
    kind: str
    job: str | None
    quota: str | None
    dag_id: str | None = None
    devices: str | None = None
    checkpoint_at: float | None = None
    """On ``stopped``: when the preempted run last saved its work (None: it had no checkpoint)."""
    gpu_type: str | None = None
    """The GPU type the job held (``admitted`` opens its hold on it); None: untyped."""


EVENT_KINDS = ("admitted", "preempted", "released", "stopped", "finished", "evicted")
"""The audit event kinds accounting reads (``EventKind`` values)."""


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a long pure computation runs, and restore it as it was.

    For work that makes millions of objects but no reference cycles (accounting here, a replay in
    :mod:`~airflow_quota_provider.simulation.engine`): a collection would free nothing, yet enough
    new objects start full collections, each of which walks all of them (here, with a million
    events, 0.2-0.4 s a collection, one or two per report; a replay of the ITP trace, 0.5 s over
    500 collections). Other threads' garbage waits until the work ends; nested calls leave the
    collector as the outermost found it.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


@collector_paused()
def holds_from_events(events: Iterable[Event]) -> list[Hold]:
    """The holds the audit log describes: ``admitted`` opens one (its ``devices`` say how many GPUs;
    a gang writes one per node, together), ``released`` closes it. A hold with a ``preempted`` event ended by preemption unless its process
    then ``finished`` on its own (it ended within its grace period) or its host was lost
    (``evicted``: not a preemption); after ``released`` the job's next ``stopped`` confirms it (and
    says when the run last saved its work), and a job failed past its preemption limit writes nothing
    more, so no word also confirms it."""
    holds: list[Hold] = []
    open_: dict[str, tuple] = {}  # job -> (start, quota, gpus, dag_id, preempted, gpu_type)
    settling: dict[str, Hold] = {}  # job -> a preempted hold released, waiting for its outcome
    append = holds.append
    new = tuple.__new__  # Hold(...) less its Python-level __new__: a third of the time, per hold
    for at, kind, job, quota, dag_id, devices, checkpoint_at, gpu_type in events:
        if job is None:
            continue
        if kind == "admitted":
            gpus = devices.count(",") + 1 if devices else 0
            if job in open_:  # the next node of a gang, admitted with node 0 (one event per host)
                hold = open_[job]
                open_[job] = hold[:2] + (hold[2] + gpus,) + hold[3:]
                continue
            if job in settling:
                append(settling.pop(job))
            open_[job] = (at, quota, gpus, dag_id, False, gpu_type)
        elif kind == "released":  # a gang's first closes its hold: its nodes are released together
            hold = open_.pop(job, None)
            if hold is None:
                continue
            start, quota_, gpus, dag, preempted, type_ = hold
            if preempted:
                settling[job] = new(Hold, (job, quota_, gpus, start, at, dag, True, None, type_))
            else:
                append(new(Hold, (job, quota_, gpus, start, at, dag, False, None, type_)))
        elif kind == "preempted":
            hold = open_.get(job)
            if hold is not None:
                open_[job] = hold[:4] + (True, hold[5])
        elif job in settling:  # stopped, finished, evicted
            hold = settling.pop(job)
            if kind == "stopped":
                append(hold if checkpoint_at is None else hold._replace(last_checkpoint_at=checkpoint_at))
            else:
                append(hold._replace(preempted=False))
    holds.extend(settling.values())
    holds.extend(Hold(job, q, gpus, start, None, dag, gpu_type=type_)
                 for job, (start, q, gpus, dag, _, type_) in open_.items())
    return holds


def period_cuts(since: float, until: float, every_s: float | None = None) -> list[tuple[float, float]]:
    """[since, until) as one period, or cut at the multiples of ``every_s`` (UTC days: ``DAY_S``)."""
    if not until > since:
        raise ValueError(f"until: {until!r} is not after since {since!r}")
    if not every_s:
        return [(since, until)]
    cuts = [since]
    edge = (since // every_s + 1) * every_s
    while edge < until:
        cuts.append(edge)
        edge += every_s
    cuts.append(until)
    return list(zip(cuts, cuts[1:]))


@collector_paused()
def account(queues: Sequence[Queue], holds: Iterable[Hold], periods: Sequence[tuple[float, float]]) -> Account:
    """Every quota's, DAG's and pool's figures over ``periods`` (contiguous, in order) from ``holds``.

    Holds of quotas the queues do not have are left out (a quota removed from the quota file). The
    cost is one pass over the holds' starts and ends in time order, plus one apportioning of lent
    GPUs per distinct usage at which some quota borrows.
    """
    result = Account(list(periods), {}, {}, {})
    if len(queues) == 1:  # the queue leaves out the holds of quotas it does not have
        _account_types(queues[0], holds, result)
        return result
    by_queue: dict[str, list[Hold]] = {queue.name: [] for queue in queues}
    queue_of = {q.name: queue.name for queue in queues for q in queue.quotas}
    for hold in holds:
        name = queue_of.get(hold.quota)
        if name is not None:
            by_queue[name].append(hold)
    for queue in queues:
        _account_types(queue, by_queue[queue.name], result)
    return result


def _account_types(queue: Queue, holds: Iterable[Hold], result: Account) -> None:
    """Account ``queue`` into ``result``: as one untyped queue, or each GPU type as its own, the
    quotas' and DAGs' figures added up over the types and kept per type too."""
    if not queue.types:
        part = Account(result.periods, {}, {}, {})
        _account_queue(queue, holds, part)
        _add_type(part, None, result)
        return
    by_type: dict[str, list[Hold]] = {t.name: [] for t in queue.types}
    first = queue.types[0].name
    for hold in holds:
        own = by_type.get(hold.gpu_type or first)
        if own is not None:  # a type the queue no longer has: left out
            own.append(hold)
    for gpu_type in queue.types:
        part = Account(result.periods, {}, {}, {})
        one = Queue(queue.name, gpu_type.capacity, gpu_type.quotas, cohorts=gpu_type.cohorts)
        _account_queue(one, by_type[gpu_type.name], part)
        _add_type(part, gpu_type.name, result)


def _add_type(part: Account, gpu_type: str | None, result: Account) -> None:
    """Add one type's account (an untyped queue's: ``gpu_type`` None) to ``result``'s sums and keep it per type."""
    if gpu_type is None:  # the queue's only account: its figures are their own sums (the same objects)
        result.quotas.update(part.quotas)
        result.dags.update(part.dags)
        result.pools.update(part.pools)
        result.quota_types.update({(start, quota, None): f for (start, quota), f in part.quotas.items()})
        result.dag_types.update({(start, quota, None, dag_id): f for (start, quota, dag_id), f in part.dags.items()})
        return
    for (start, quota), figures in part.quotas.items():
        result.quota_types[(start, quota, gpu_type)] = figures
        result.quotas.setdefault((start, quota), Figures()).add(figures)
    for (start, quota, dag_id), figures in part.dags.items():
        result.dag_types[(start, quota, gpu_type, dag_id)] = figures
        result.dags.setdefault((start, quota, dag_id), Figures()).add(figures)
    for key, pool in part.pools.items():
        total = result.pools.setdefault(key, PoolFigures())
        total.capacity_s += pool.capacity_s
        total.drawn += pool.drawn


def _account_queue(queue: Queue, holds: Iterable[Hold], result: Account) -> None:
    periods = result.periods
    since, until = periods[0][0], periods[-1][1]
    starts = [start for start, _ in periods]
    capacity = [q.capacity for q in queue.quotas]
    n = len(capacity)
    if not n:  # no quota (a queue the quota file has none for): its pool only
        for period in periods:
            _settle_period(queue, period, capacity, [], [], [], result)
        return

    points, gpus_of, share_of, share_keys, preempted = _points(queue, holds, starts, until)

    used = [0] * n
    last = [since] * n  # when each quota's lazily integrated figures were last brought up to date
    within_s = [0.0] * n
    borrowed_s = [0.0] * n
    clock = [0.0] * n  # per quota: the integral of within/used, each running GPU's share of used_within
    opened: dict[int, tuple[float, float, int]] = {}  # hold number -> (time, clock, quota) where its piece began
    shares: list[Figures | None] = [None] * len(share_keys)  # the period's share of each (quota, dag)
    charged: list[int] = []  # the shares the period charged, in the order first charged
    borrowing: dict[tuple[int, ...], float] = {}  # the period's usage vectors with a borrower -> seconds
    lent_at: dict[tuple[int, ...], list[int]] = {}  # usage vector -> each quota's lent GPUs, once each
    borrowed_total = 0
    moment = since
    period = 0
    # Flat queues: lent GPU-seconds through a clock, O(1) per point. ``ratio`` is the share of every
    # lendable GPU that borrowers hold beyond the common pool; each quota's lent figure grows with
    # its own offer times the clock since its offer last changed.
    flat = not queue.cohorts
    quotas = queue.quotas
    common = queue.capacity - sum(capacity)
    # Each quota's offer at each usage within its capacity (none above it): lendable() once per value.
    offers = [[lendable(quota, u) for u in range(quota.capacity + 1)] for quota in quotas]
    offer = [table[0] for table in offers]
    supply = sum(offer)
    lent_clock = 0.0
    lent_last = [0.0] * n
    lent_s = [0.0] * n
    ratio = 0.0

    def close_piece(h: int, t: float) -> None:
        """Charge hold ``h``'s DAG its share of its quota's figures (brought up to ``t``) since its piece began."""
        began, clock_then, q = opened.pop(h)
        gpus = gpus_of[h]
        share_within = gpus * (clock[q] - clock_then)
        share = shares[share_of[h]]
        if share is None:
            share = shares[share_of[h]] = Figures()
            charged.append(share_of[h])
        share.used_within += share_within
        share.borrowed += gpus * (t - began) - share_within

    def close_period(t: float) -> None:
        """Settle the period ending at ``t``, every quota's figures brought up to it."""
        nonlocal borrowing
        for h in list(opened):
            q = opened[h][2]
            close_piece(h, t)
            opened[h] = (t, clock[q], q)
        start = periods[period][0]
        lent = list(lent_s) if flat else _lent_of_states(queue, borrowing, lent_at)
        _settle_period(queue, periods[period], capacity, within_s, borrowed_s, lent, result)
        for number in charged:
            quota, dag_id = share_keys[number]
            result.dags[(start, quota, dag_id)] = shares[number]
            shares[number] = None
        charged.clear()
        for q in range(n):
            within_s[q] = borrowed_s[q] = lent_s[q] = 0.0
        borrowing = {}

    last_quota = n - 1
    for t, order, q, h in points:
        if t > moment:  # the clocks of lent GPUs, or the seconds at each usage with a borrower (cohorts)
            if ratio:
                lent_clock += (t - moment) * ratio
            elif borrowed_total and not flat:
                key = tuple(used)
                borrowing[key] = borrowing.get(key, 0.0) + (t - moment)
            moment = t
        # Bring quota q's figures up to t: lent by the clock (flat queues), used since its last change.
        if lent_clock != lent_last[q]:
            lent_s[q] += offer[q] * (lent_clock - lent_last[q])
            lent_last[q] = lent_clock
        old = used[q]
        c = capacity[q]
        span = t - last[q]
        if span > 0:
            if old:
                if old > c:
                    within_s[q] += span * c
                    borrowed_s[q] += span * (old - c)
                    clock[q] += span * c / old
                else:
                    within_s[q] += span * old
                    clock[q] += span
            last[q] = t
        if h < 0:  # the period ends
            if q == last_quota:
                close_period(t)
                period += 1
            continue
        if order:
            new = old + gpus_of[h]
            opened[h] = (t, clock[q], q)
        else:
            close_piece(h, t)
            new = old - gpus_of[h]
        used[q] = new
        borrowed_total += (new - c if new > c else 0) - (old - c if old > c else 0)
        if flat:
            now_offer = offers[q][new] if new < c else 0
            supply += now_offer - offer[q]
            offer[q] = now_offer
            drawn = borrowed_total - common
            ratio = (drawn / supply if drawn < supply else 1.0) if drawn > 0 and supply > 0 else 0.0
    _add_lost(preempted, starts, until, result)


class Config(NamedTuple):
    """The job queues in force from ``at`` until the next configuration's ``at``."""

    at: float
    queues: Sequence[Queue]


@collector_paused()
def account_history(configs: Sequence[Config], holds: Iterable[Hold], periods: Sequence[tuple[float, float]]) -> Account:
    """:func:`account` over ``periods`` with each moment charged by the configuration in force then.

    ``configs`` are in time order; nothing is charged before the first (no quota existed). The
    periods are split where the configuration changes, each part accounted with its job queues,
    and the parts added back into their period: a quota present for part of a period is charged
    capacity for that part only. Consecutive configurations with equal queues are one (a scheduler
    restart reloads the same file), so the cost grows with the number of real changes.
    """
    periods = list(periods)
    result = Account(periods, {}, {}, {})
    if not periods:
        return result
    since, until = periods[0][0], periods[-1][1]
    spans: list[tuple[float, float, Sequence[Queue]]] = []  # (start, end, queues), within the periods
    for i, (at, queues) in enumerate(configs):
        start, end = max(at, since), min(configs[i + 1].at if i + 1 < len(configs) else until, until)
        if start >= end:
            continue
        if spans and spans[-1][1] == start and tuple(spans[-1][2]) == tuple(queues):
            spans[-1] = (spans[-1][0], end, queues)
        else:
            spans.append((start, end, queues))
    if len(spans) == 1 and spans[0][:2] == (since, until):  # one configuration throughout: no parts
        return account(spans[0][2], holds, periods)
    holds = list(holds)
    for start, end, queues in spans:
        overlapping = [(a, b) for a, b in periods if a < end and b > start]
        pieces = [(max(a, start), min(b, end)) for a, b in overlapping]
        period_of = {piece[0]: a for piece, (a, _) in zip(pieces, overlapping)}
        inside = [h for h in holds if h.start < end and (h.end is None or h.end > start)]
        part = account(queues, inside, pieces)
        for (at, quota), figures in part.quotas.items():
            result.quotas.setdefault((period_of[at], quota), Figures()).add(figures)
        for (at, quota, dag_id), figures in part.dags.items():
            result.dags.setdefault((period_of[at], quota, dag_id), Figures()).add(figures)
        for (at, *key), figures in part.quota_types.items():
            result.quota_types.setdefault((period_of[at], *key), Figures()).add(figures)
        for (at, *key), figures in part.dag_types.items():
            result.dag_types.setdefault((period_of[at], *key), Figures()).add(figures)
        for (at, queue), pool in part.pools.items():
            total = result.pools.setdefault((period_of[at], queue), PoolFigures())
            total.capacity_s += pool.capacity_s
            total.drawn += pool.drawn
    return result


class _Points(NamedTuple):
    """A job queue's holds as points in time (:func:`_points`)."""

    points: list[tuple[float, int, int, int]]
    """(time, order, quota index, hold number), in time order."""
    gpus: list[int]
    """Hold number -> its GPUs. The holds numbered are the queue's that overlap the periods."""
    shares: list[int]
    """Hold number -> the number of its (quota, dag_id) share."""
    share_keys: list[tuple[str, str | None]]
    """Share number -> (quota, dag_id)."""
    preempted: list[Hold]
    """The queue's holds that ended by preemption."""


def _points(queue: Queue, holds: Iterable[Hold], starts: list[float], until: float) -> _Points:
    """The points of ``queue``'s holds over the periods from ``starts`` to ``until``, in one pass.

    A hold is a start (order 1) and an end (order 0): ends before starts at one moment, so a hold
    released as another is admitted never counts both. A period ends with one point per quota
    (hold number -1) that brings the quota up to date, the last quota's settling the period: first
    of all at a cut between periods (order -1), last of all at the end (order 2). Holds of other
    quotas are left out.
    """
    since, n = starts[0], len(queue.quotas)
    index = {quota.name: q for q, quota in enumerate(queue.quotas)}
    points: list[tuple[float, int, int, int]] = [(start, -1, q, -1) for start in starts[1:] for q in range(n)]
    points += [(until, 2, q, -1) for q in range(n)]
    append = points.append
    gpus_of: list[int] = []
    share_of: list[int] = []
    share_keys: list[tuple[str, str | None]] = []
    numbers: list[dict[str | None, int]] = [{} for _ in range(n)]  # per quota: dag_id -> share number
    preempted: list[Hold] = []
    for hold in holds:
        _, quota, gpus, start, end, dag_id, was_preempted, _, _ = hold
        q = index.get(quota)
        if q is None:
            continue
        if was_preempted and end is not None:
            preempted.append(hold)
        start = start if start > since else since
        end = until if end is None or end > until else end
        if start < end and gpus > 0:
            h = len(gpus_of)
            append((start, 1, q, h))
            append((end, 0, q, h))
            gpus_of.append(gpus)
            number = numbers[q].get(dag_id)
            if number is None:
                number = numbers[q][dag_id] = len(share_keys)
                share_keys.append((quota, dag_id))
            share_of.append(number)
    points.sort()
    return _Points(points, gpus_of, share_of, share_keys, preempted)


def _settle_period(
    queue: Queue,
    period: tuple[float, float],
    capacity: list[int],
    within_s: list[float],
    borrowed_s: list[float],
    lent_s: list[float],
    result: Account,
) -> None:
    start, end = period
    span = end - start
    for i, quota in enumerate(queue.quotas):
        cap_s = capacity[i] * span
        result.quotas[(start, quota.name)] = Figures(
            capacity_s=cap_s,
            used_within=within_s[i],
            borrowed=borrowed_s[i],
            lent=lent_s[i],
            idle=cap_s - within_s[i] - lent_s[i],
        )
    pool = queue.capacity - sum(capacity)
    result.pools[(start, queue.name)] = PoolFigures(capacity_s=pool * span, drawn=sum(borrowed_s) - sum(lent_s))


def _lent_of_states(
    queue: Queue, borrowing: dict[tuple[int, ...], float], lent_at: dict[tuple[int, ...], list[int]]
) -> list[float]:
    """Each quota's lent GPU-seconds over the usage vectors a period spent seconds at (cohorts)."""
    lent_s = [0.0] * len(queue.quotas)
    for used, seconds in borrowing.items():
        lent = lent_at.get(used)
        if lent is None:
            lent = lent_at[used] = _lent(queue, used)
        for i, gpus in enumerate(lent):
            lent_s[i] += gpus * seconds
    return lent_s


def _lent(queue: Queue, used: tuple[int, ...]) -> list[int]:
    """Each quota's lent GPUs while the quotas hold ``used``: the policy's own split."""
    usage = usage_for(State.for_queue(queue, (), ()), {quota.name: gpus for quota, gpus in zip(queue.quotas, used)})
    lent = usage.lent()
    return [lent[quota.name] for quota in queue.quotas]


def _add_lost(preempted: list[Hold], starts: list[float], until: float, result: Account) -> None:
    """Each preempted hold's lost stretch, cut at the period boundaries, charged to its quota and DAG."""
    since = starts[0]
    quotas, dags = result.quotas, result.dags
    for hold in preempted:
        begin, end = lost_span(hold.start, hold.end, hold.last_checkpoint_at)
        begin, end = max(begin, since), min(end, until)
        while begin < end:
            p = bisect.bisect_right(starts, begin) - 1
            piece_end = min(end, starts[p + 1]) if p + 1 < len(starts) else end
            seconds = hold.gpus * (piece_end - begin)
            quotas[(starts[p], hold.quota)].lost += seconds
            share = dags.get((starts[p], hold.quota, hold.dag_id))
            if share is None:
                share = dags[(starts[p], hold.quota, hold.dag_id)] = Figures()
            share.lost += seconds
            begin = piece_end


def lost_by_end(holds: Iterable[Hold], since: float, until: float) -> dict[str, float]:
    """Per quota, the whole lost stretch of each preempted hold whose GPUs were freed in
    [since, until): a counter can only count a loss once the preemption is known, so the metrics
    charge it when the GPUs are freed rather than cut at period boundaries as :func:`account` does."""
    out: dict[str, float] = {}
    for hold in holds:
        if hold.preempted and hold.end is not None and since <= hold.end < until:
            begin, end = lost_span(hold.start, hold.end, hold.last_checkpoint_at)
            out[hold.quota] = out.get(hold.quota, 0.0) + hold.gpus * (end - begin)
    return out


def totals(
    account_: Account, by: str = "quota", owners: Mapping[str, str] | None = None, *, per_type: bool = False
) -> dict[str, Figures] | dict[tuple[str, str | None], Figures]:
    """The account summed over its periods, per ``quota``, ``dag`` or ``owner`` (``owners``: DAG id ->
    owner; a DAG without one is charged to ``"unknown"``). Only quotas carry lent, idle and capacity.
    ``per_type``: keyed (name, GPU type) instead, the type None for untyped queues' figures."""
    out: dict = {}
    if per_type:
        for key, _, figures in _keyed(account_, by, owners, per_type):
            out.setdefault(key, Figures()).add(figures)
        return out
    if by == "quota":
        for (_, quota), figures in account_.quotas.items():
            out.setdefault(quota, Figures()).add(figures)
        return out
    _check_by(by)
    for (_, _, dag_id), figures in account_.dags.items():
        out.setdefault(_dag_key(dag_id, by, owners), Figures()).add(figures)
    return out


def costs(
    account_: Account, prices: Mapping[tuple[str, str | None], float], by: str = "quota",
    owners: Mapping[str, str] | None = None, *, per_type: bool = False,
) -> dict:
    """The cost of each of :func:`totals`' keys: its :data:`CHARGED` GPU-hours on each quota and GPU
    type times ``prices[(quota, GPU type)]`` (per GPU-hour; the type None for an untyped queue). A
    key with figures on an unpriced quota and type costs None: a partial sum would read as the whole."""
    out: dict = {}
    for key, (quota, gpu_type), figures in _keyed(account_, by, owners, per_type):
        price = prices.get((quota, gpu_type))
        if price is None or out.get(key, 0.0) is None:
            out[key] = None
            continue
        out[key] = out.get(key, 0.0) + sum(getattr(figures, kind) for kind in CHARGED) / 3600.0 * price
    return out


def _keyed(
    account_: Account, by: str, owners: Mapping[str, str] | None, per_type: bool
) -> Iterator[tuple[Any, tuple[str, str | None], Figures]]:
    """Each per-type figure of the account as (its key in :func:`totals`, (quota, GPU type), figures)."""
    if by == "quota":
        for (_, quota, gpu_type), figures in account_.quota_types.items():
            yield ((quota, gpu_type) if per_type else quota), (quota, gpu_type), figures
        return
    _check_by(by)
    for (_, quota, gpu_type, dag_id), figures in account_.dag_types.items():
        key = _dag_key(dag_id, by, owners)
        yield ((key, gpu_type) if per_type else key), (quota, gpu_type), figures


def _check_by(by: str) -> None:
    if by not in ("dag", "owner"):
        raise ValueError(f"by: {by!r} is not one of quota, dag, owner")


def _dag_key(dag_id: str | None, by: str, owners: Mapping[str, str] | None) -> str:
    if by == "owner":
        return (owners or {}).get(dag_id or "", "unknown")
    return dag_id or "unknown"
