"""Time one decision cycle at 1,000 and 10,000 pending jobs (2,000 running, 20 quotas).

    python benchmarks/decide.py [--repeat N] [--seed S] [--gpus-per-host G [--gangs F]] [--cohorts] [--types T]

Prints the best-of-N time per size, the ratio between them, and the peak memory (tracemalloc) of one
cycle. Goal (issue 2): at most 50 ms at 10,000 pending on a 2-core machine, ratio at most 15. With
``--gpus-per-host``, the same queue is spread over hosts of G GPUs (each running job on a random host
with room for it), and the policy places jobs on them (issue 10). With ``--cohorts``, the 20 quotas
are grouped in a two-level tree: two divisions of two departments of five quotas each (issue 14).
With ``--gangs F`` (and hosts), a fraction F of the waiting jobs are gangs of 2-4 nodes of 4 or G GPUs
(the others unchanged), and the same queues are timed without them: goal (issue 32) at most 1.5
times the time without gangs at F = 0.1. With ``--types T``, the same queue's capacity, every quota's and
the hosts are split evenly between T GPU types (issue 33): a running job runs on its host's type (or,
without hosts, the first with room), a third of the waiting jobs ask for one type, a third for two in
some order, a third for none; the same queues are timed untyped: goal at most 1.3 times at T = 3.
"""

from __future__ import annotations

import argparse
import random
import time
import tracemalloc

from dataclasses import replace

from airflow_quota_provider.policy import Cohort, Host, Job, PreemptionPolicy, Quota, State, decide
from airflow_quota_provider.policy.types import GpuType

SHARING = ("lend_and_borrow", "lend_and_borrow", "lend", "reserve")
WITHIN = ("lower_priority", "lower_or_newer_equal_priority", "never")
RECLAIM = ("any", "lower_priority", "never")


def make_state(
    pending_jobs: int, *, running_jobs: int = 2000, quotas: int = 20, seed: int = 1, gpus_per_host: int | None = None,
    gangs: float = 0.0,
) -> tuple[State, float]:
    """A busy queue: mixed sharing rules, priorities 0-99, sizes 1-8 GPUs running and 1-16 waiting,
    every quota over-subscribed; with ``gpus_per_host``, on hosts of that size."""
    rng = random.Random(seed)
    capacity = 8000
    hosts = None if gpus_per_host is None else [Host(f"h{i:04d}", gpus_per_host) for i in range(capacity // gpus_per_host)]
    free = {host.name: host.gpus for host in hosts or ()}
    place = random.Random(seed + 1)
    quota_list = tuple(
        Quota(
            name=f"q{i:02d}",
            capacity=capacity // quotas - (20 if i % 5 == 0 else 0),
            sharing=SHARING[i % len(SHARING)],
            borrow_limit=None if i % 3 else 100,
            weight=1 + i % 3,
            preemption=PreemptionPolicy(
                within_quota=WITHIN[i % len(WITHIN)],
                reclaim=RECLAIM[i % len(RECLAIM)],
                borrow_within=50 if i % 4 == 0 and SHARING[i % len(SHARING)] == "lend_and_borrow" else None,
            ),
        )
        for i in range(quotas)
    )
    now = 100_000.0
    running = []
    used = 0
    names = [q.name for q in quota_list]
    for i in range(running_jobs):
        gpus = rng.choice((1, 1, 2, 4, 8))
        if used + gpus > capacity:
            break
        host = None
        if hosts is not None:  # its own draws, so that the jobs are the same as without hosts
            room = [name for name, left in free.items() if left >= gpus]
            if not room:
                continue
            host = place.choice(room)
            free[host] -= gpus
        used += gpus
        started = rng.uniform(0, now)
        running.append(
            Job(
                id=f"r{i}",
                quota=names[i % quotas],
                gpus=gpus,
                priority=rng.randrange(100),
                submitted_at=started - rng.uniform(0, 100),
                started_at=started,
                host=host,
            )
        )
    pending = [
        Job(
            id=f"p{i}",
            quota=rng.choice(names),
            gpus=rng.choice((1, 1, 2, 4, 8, 16)),
            priority=rng.randrange(100),
            submitted_at=rng.uniform(0, now),
        )
        for i in range(pending_jobs)
    ]
    draw = random.Random(seed + 2)  # its own draws: without gangs the jobs are those of the run with them
    for i, job in enumerate(pending):
        if draw.random() < gangs:
            nodes, per = draw.choice((2, 3, 4)), draw.choice((4, gpus_per_host))
            pending[i] = replace(job, gpus=per * nodes, nodes=nodes)
    hosts_tuple = None if hosts is None else tuple(hosts)
    return State(capacity=capacity, quotas=quota_list, running=tuple(running), pending=tuple(pending), hosts=hosts_tuple), now


def with_types(state: State, count: int) -> State:
    """``state`` split between ``count`` GPU types (see the module's docstring)."""
    names = [f"t{k}" for k in range(count)]

    def split(total: int) -> list[int]:
        return [total // count + (total % count if k == 0 else 0) for k in range(count)]

    shares = {q.name: split(q.capacity) for q in state.quotas}
    types = tuple(
        GpuType(name, split(state.capacity)[k], tuple(
            replace(q, capacity=shares[q.name][k], borrow_limit=None if q.borrow_limit is None else q.borrow_limit // count)
            for q in state.quotas
        ))
        for k, name in enumerate(names)
    )
    hosts = None
    if state.hosts is not None:
        hosts = tuple(replace(h, type=names[i * count // len(state.hosts)]) for i, h in enumerate(state.hosts))
    host_type = {h.name: h.type for h in hosts or ()}
    room = {t.name: t.capacity for t in types}
    running = []
    for i, job in enumerate(state.running):
        name = host_type.get(job.host) or next((n for n in names[i % count:] + names if room[n] >= job.gpus), None)
        if name is None or room[name] < job.gpus:
            continue
        room[name] -= job.gpus
        running.append(replace(job, gpu_type=name))
    draw = random.Random(7)
    pending = []
    for job in state.pending:
        kind = draw.randrange(3)
        asked = () if kind == 0 else tuple(draw.sample(names, min(kind, count)))
        pending.append(replace(job, gpu_types=asked))
    return replace(state, running=tuple(running), pending=tuple(pending), hosts=hosts, types=types)


def in_cohorts(state: State) -> State:
    """``state`` with its quotas in two divisions (d0, d1) of two departments each, five quotas to a
    department, taken in order; the divisions own nothing, the departments lend everything."""
    cohorts = [Cohort(f"d{d}") for d in range(2)] + [Cohort(f"d{d}-{k}", parent=f"d{d}") for d in range(2) for k in range(2)]
    quotas = tuple(replace(q, cohort=f"d{i // 10}-{i // 5 % 2}") for i, q in enumerate(state.quotas))
    return replace(state, quotas=quotas, cohorts=tuple(cohorts))


def best_time(state: State, now: float, repeat: int) -> tuple[float, object]:
    best = float("inf")
    decision = None
    for _ in range(repeat):
        start = time.perf_counter()
        decision = decide(state, now)
        best = min(best, time.perf_counter() - start)
    return best, decision


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--gpus-per-host", type=int, default=None, help="spread the queue over hosts of this size")
    parser.add_argument("--cohorts", action="store_true", help="group the quotas in a two-level tree of cohorts")
    parser.add_argument("--gangs", type=float, default=0.0, help="fraction of waiting jobs that are gangs (with hosts)")
    parser.add_argument("--types", type=int, default=0, help="split the queue between this many GPU types (1 to 5)")
    args = parser.parse_args()
    if args.types and not 1 <= args.types <= 5:
        parser.error(f"--types: {args.types} is not from 1 to 5")
    if args.gangs and args.gpus_per_host is None:
        parser.error("--gangs: needs --gpus-per-host (a gang spans hosts)")
    if not 0 <= args.gangs <= 1:
        parser.error(f"--gangs: {args.gangs} is not a fraction from 0 to 1")
    if args.gpus_per_host is not None and (args.gpus_per_host < 8 or 8000 % args.gpus_per_host):
        parser.error("--gpus-per-host: must divide 8,000 and be at least 8 (the largest running job)")
    results = {}
    for pending in (1_000, 10_000):
        state, now = make_state(pending, seed=args.seed, gpus_per_host=args.gpus_per_host, gangs=args.gangs)
        if args.cohorts:
            state = in_cohorts(state)
        untyped = state
        if args.types:
            state = with_types(state, args.types)
        seconds, decision = best_time(state, now, args.repeat)
        if args.types:
            untyped_s, untyped_decision = best_time(untyped, now, args.repeat)
        if args.gangs:
            plain, _ = make_state(pending, seed=args.seed, gpus_per_host=args.gpus_per_host)
            without, _ = best_time(in_cohorts(plain) if args.cohorts else plain, now, args.repeat)
        tracemalloc.start()
        decide(state, now)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        results[pending] = seconds
        hosts = "" if state.hosts is None else f" hosts={len(state.hosts)}x{args.gpus_per_host}"
        hosts += f" cohorts={len(state.cohorts)}" if state.cohorts else ""
        hosts += f" gangs={sum(1 for job in state.pending if job.nodes > 1)}" if args.gangs else ""
        print(
            f"pending={pending:>6} running={len(state.running)} quotas={len(state.quotas)}{hosts}: "
            f"{seconds * 1000:7.2f} ms per cycle (best of {args.repeat}), peak memory {peak / 2**20:.1f} MiB; "
            f"admit={len(decision.admit)} preempt={len(decision.preempt)} pending={len(decision.pending)} reject={len(decision.reject)}"
        )
        if args.gangs:
            print(f"  without gangs {without * 1000:7.2f} ms: ratio {seconds / without:.2f} (goal <= 1.5)")
        if args.types:
            # Each type's quotas are a third as large as the untyped ones: more jobs preempt, so the two
            # decisions do different work. Both are printed, so that the ratio is read with them.
            print(f"  {args.types} GPU types ({len(state.running)} of the running jobs fit them); untyped {untyped_s * 1000:7.2f} ms "
                  f"(admit={len(untyped_decision.admit)} preempt={len(untyped_decision.preempt)}): "
                  f"ratio {seconds / untyped_s:.2f} (goal <= 1.3)")
    print(f"ratio 10,000 / 1,000 pending: {results[10_000] / results[1_000]:.2f}")


if __name__ == "__main__":
    main()
