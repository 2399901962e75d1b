"""One decision cycle: ``decide(state, now) -> Decision``.

The cycle, in order:

1. Jobs rejected outright (more GPUs than their quota can ever hold or than the largest host has,
   priority above ``max_priority``).
2. Jobs holding capacity while their victims stop: their GPUs are counted as taken (logically, and on
   the host they will run on), and they wait until their victims are gone, even when other GPUs are free
   (those are someone else's). Once the victims have stopped the job is an ordinary waiting job that
   fits, and starts. (If the quota file or the hosts changed so that the hold no longer fits, the job
   queues again like any other.)
3. Within-quota pass, in queue order (priority, then FIFO): a job that fits within its own quota's
   capacity starts; one that would fit but finds its lent capacity in use reclaims it (phase 1 of
   the victim search). Non-borrowing admissions go before borrowing ones, as in Kueue, so a reclaim
   is never undone by a borrower in the same cycle.
4. Borrowing pass, in fair-share order (borrowed GPUs per unit of weight, lowest first, recomputed
   after every admission): the rest start if they may borrow, or search for victims (both phases).
   A quota with a job held for GPUs not yet free takes no part: its jobs behind that one wait.
   With cohorts, jobs that borrow closer to their quota go first (within their cohort before from
   the cohort above, as Kueue orders by the level a workload borrows at), so a reclaim at a level is
   not undone by a borrower from higher up; then fair sharing, level by level from the top.
5. Every job still waiting gets its position in its quota's queue and a reason (unless the caller
   asks for none).

With hosts (``State.hosts``), a job starts only where it fits physically: admission picks the host it
fills best (:mod:`.placement`), and a job that fits its quota but finds no host with enough free GPUs
searches for victims that make room on a host like a job that does not fit, or waits, its reason
naming the fragmentation. Its victims may be on several hosts (the quota arithmetic is queue-wide);
one host has room once they are gone. A gang counts all its nodes' GPUs in the quota arithmetic and
needs a host per node (:mod:`.placement`), all at once. The quota arithmetic is the same with and
without hosts; without them the queue is one implicit host of its capacity, a gang is its GPUs in
all, and nothing of this applies.

Queueing is Kueue's ``BestEffortFIFO`` (its default; there is no ``StrictFIFO``): a job that can
neither start nor find victims does not block the jobs behind it in its quota's queue, and a job
held for its victims keeps the capacity they free.

As many jobs start per cycle as fit. Both passes skip a quota as soon as none of its remaining jobs
can start or find victims (it is *closed*) until a preemption or a new borrower changes that, so a
cycle over a :class:`~airflow_quota_provider.policy.backlog.Backlog` costs what it places, not what
waits. The input is never mutated and the result depends on nothing but ``(state, now)``.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import defaultdict

from airflow_quota_provider.policy.backlog import Backlog
from airflow_quota_provider.policy.candidates import Candidates
from airflow_quota_provider.policy.capacity import ever_fits, ever_fits_each, usage_for
from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.decision import Decision, Pending, Preemption, Rejection
from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.ordering import entry_key, queue_order
from airflow_quota_provider.policy.placement import Placement
from airflow_quota_provider.policy.preemption import find_victims, may_find, search_phases
from airflow_quota_provider.policy.preemption_policy import effective_max_preemptions, limit_reached, may_preempt
from airflow_quota_provider.policy.reasons import Explainer
from airflow_quota_provider.policy.running import Running
from airflow_quota_provider.policy.state import State
from airflow_quota_provider.policy.types import decide_types
from airflow_quota_provider.policy.vocabulary import Reclaim, WithinQuota


def decide(state: State, now: float, *, explain: bool = True) -> Decision:
    """Decide which pending jobs start, which running jobs are preempted, and why the rest wait.

    With ``explain=False`` the waiting jobs get no position or reason (``pending`` stays empty), for
    callers that act only on admissions, preemptions and rejections (the simulator).
    """
    if state.types:
        return decide_types(state, now, explain, _decide_type)
    return _Cycle(state, now).run(explain)


def _decide_type(state: State, now: float, explain: bool, gpu_type: str) -> Decision:
    """One GPU type of a typed job queue, as an untyped one whose jobs may ask for types."""
    return _Cycle(state, now, of_type=gpu_type).run(explain)


def rejection_reason(
    job: Job, quota: Quota, state: State, most: int | None = None, largest_host: int | None = None,
    placement: Placement | None = None,
) -> str | None:
    """Why ``job`` can never run on ``quota`` under this configuration, or None.

    ``most`` is :func:`ever_fits` for the quota, ``largest_host`` the GPUs of the state's largest
    host and ``placement`` the state's hosts (counted once per size for gangs), when the caller has
    them already.
    """
    above = quota.above_max_priority(job.priority)
    if above is not None:
        return f"priority {above}"
    if most is None:
        most = ever_fits(quota, state.quotas, state.capacity, state.cohorts)
    if job.gpus > most:
        return (
            f"asks for {job.gpus} GPUs; quota {quota.name} can never hold more than {most} "
            f"(capacity {quota.capacity}, sharing {quota.sharing}"
            + (f", borrow_limit {quota.borrow_limit}" if quota.borrow_limit is not None else "")
            + (f", in cohort {quota.cohort}" if quota.cohort is not None else "")
            + f", job queue capacity {state.capacity})"
        )
    if state.hosts is not None:
        if job.nodes > 1:
            per = job.gpus_per_node
            enough = (
                placement.hosts_with_at_least(per) if placement is not None
                else sum(1 for host in state.hosts if host.gpus >= per)
            )
            if enough < job.nodes:
                return (
                    f"asks for {job.nodes} hosts with {per} {'GPU' if per == 1 else 'GPUs'} each; this job queue has "
                    f"{enough} {'host' if enough == 1 else 'hosts'} of at least {per} {'GPU' if per == 1 else 'GPUs'}"
                )
            return None
        if largest_host is None:
            largest_host = max((host.gpus for host in state.hosts), default=0)
        if job.gpus > largest_host:
            return f"asks for {job.gpus} GPUs; the largest host of this job queue has {largest_host}"
    return None


class _Cycle:
    def __init__(self, state: State, now: float, *, of_type: str | None = None) -> None:
        self.state = state
        self.now = now
        self.of_type = of_type
        """The GPU type of a typed job queue being decided (:func:`_decide_type`): waiting jobs'
        reasons start with its name."""
        self.backlog = Backlog.of(state.pending)
        self.running = Running.of(state.running)
        self.usage = usage_for(state, self.running.in_use)
        self.quotas = self.usage.quotas
        self.placement = None if state.hosts is None else Placement(state.hosts, self.running)
        self.usage.physical = self.running.physical
        self.candidates = Candidates(self.running, self.quotas, now)
        if self.placement is not None and self.placement.down:
            # A job on a host that is down cannot be told to stop: never a victim, wherever it is asked.
            self.candidates.taken.update(job.id for job in state.running if job.host in self.placement.down)
        self.decision = Decision(placed=self.placement is not None)
        self.waiting_for: dict[str, tuple[list[str], str | None]] = {}
        """Held jobs: capacity is theirs, GPUs not yet free; the victims they wait for and the host
        their GPUs are reserved on (None without hosts)."""
        self.awaiting: dict[str, list[str]] = {}
        """Held jobs waiting for running jobs expected to finish within their grace period (spared)."""
        self.reserving: dict[str, str] = {}
        """Quotas with a job held for GPUs that are not free yet (victims stopping, jobs finishing),
        and the first such job: their jobs behind it do not borrow (:meth:`_borrowing_pass`)."""
        self.epoch = 0
        """Counts the changes that can make a failed fit or search succeed (preemptions, a quota
        starting to borrow); failures memoised at one epoch stay failures until the next."""
        self._fit_failed: dict[tuple[str, bool], tuple[int, int]] = {}
        self._search_failed: dict[tuple[str, bool], tuple[int, int]] = {}
        self.handled: set[str] = set()
        """Waiting jobs rejected, held or placed in this cycle: the passes skip them."""
        self.drained_for: tuple[Job, tuple[str, ...], float] | None = None
        """The gang whose hosts are kept for it this cycle, those hosts, and when the last is expected
        to have room for it (``inf``: unknown), if any (:meth:`_drain_for`)."""
        self.longest_waiting_gang: str | None = None
        """The waiting gang submitted first (then by id), the only one hosts may be kept for; found
        when a gang first asks for them."""

    def run(self, explain: bool) -> Decision:
        self._reject()
        # Held from an earlier cycle; re-checked, since the quota file or the hosts may have changed since.
        held = [job for job_id in self.running.preemptors() if (job := self.backlog.get(job_id)) is not None]
        for job in sorted(held, key=queue_order):
            if job.id in self.handled or not self.usage.fits(job.quota, job.gpus, borrow=True):
                continue
            victims = self.running.stopping_for(job.id)
            host = None if self.placement is None else self._preemptor_place(job, victims, stopping=True)
            if self.placement is None or host is not None:
                self._hold(job, sorted(victim.id for victim in victims), host)
                self.handled.add(job.id)
        self._within_quota_pass()
        self._borrowing_pass()
        if explain:
            self._explain()
        return self.decision

    def _reject(self) -> None:
        """Jobs that can never run; a quota whose largest and highest-priority jobs pass is skipped."""
        rejected: list[tuple[tuple, Rejection]] = []
        largest_host = None if self.placement is None else self.placement.largest
        most_of = ever_fits_each(self.state.quotas, self.state.capacity, self.state.cohorts)
        backlog = self.backlog
        for name in backlog.quotas():
            quota = self.quotas[name]
            most = most_of[name]
            if quota.max_priority is None or backlog.highest_priority(name) <= quota.max_priority:
                if largest_host is None or not backlog.has_gangs(name):
                    if backlog.largest(name) <= (most if largest_host is None else min(most, largest_host)):
                        continue
                elif (
                    backlog.largest(name) <= most
                    and backlog.largest_single(name) <= largest_host
                    and all(nodes <= self.placement.hosts_with_at_least(per) for per, nodes in backlog.gang_shapes(name))
                ):
                    continue
            for key, job in self.backlog.entries(name):
                reason = rejection_reason(job, quota, self.state, most, largest_host, self.placement)
                if reason is not None:
                    rejected.append((key, Rejection(job.id, reason)))
                    self.handled.add(job.id)
        if backlog.asking_types and not self.of_type:
            for job in backlog:
                if job.gpu_types and job.id not in self.handled:
                    rejected.append((queue_order(job), Rejection(job.id, (
                        f"gpu_type: {', '.join(job.gpu_types)} asked, but this job queue has no GPU types "
                        "(its capacity is one number); leave gpu_type unset or give the queue a capacity per type"))))
                    self.handled.add(job.id)
        self.decision.reject = [rejection for _, rejection in sorted(rejected, key=entry_key)]

    # -- placing one job ------------------------------------------------------------------------

    def _take(self, job: Job) -> None:
        """Count ``job``'s GPUs against its quota.

        Taking capacity only makes later fits and searches harder, except that a quota starting to
        borrow makes its running jobs reclaim candidates: only that invalidates memoised failures (with
        cohorts, a cohort starting to borrow too).
        """
        usage = self.usage
        if usage.tree is not None:
            starts = usage.borrow_starts
            usage.add(job.quota, job.gpus)
            if usage.borrow_starts != starts:
                self.epoch += 1
            return
        was_borrowing = usage.is_borrowing(job.quota)
        usage.add(job.quota, job.gpus)
        if not was_borrowing and usage.is_borrowing(job.quota):
            self.epoch += 1

    def _preemptor_place(self, job: Job, victims, *, stopping: bool) -> str | tuple[str, ...] | None:
        placement = self.placement
        if job.nodes == 1:
            return placement.host_for_preemptor(job, victims, stopping=stopping)
        return placement.hosts_for_preemptor(job, victims, stopping=stopping)

    def _hold(
        self, job: Job, victims: list[str], host: str | tuple[str, ...] | None, awaited: list[str] | None = None
    ) -> None:
        """Count ``job``'s GPUs as taken (on ``host`` too, with hosts; a gang's hosts, one per node). A
        job with victims (or jobs it waits for to finish, ``awaited``) waits for them to stop, even if
        other GPUs are free right now (they belong to others); one without starts if the GPUs are free."""
        self._take(job)
        if awaited:
            self.awaiting[job.id] = awaited
        if (
            not victims
            and not awaited
            and self.usage.physically_free() >= job.gpus
            and (host is None or self.placement.room_for(job, host))
        ):
            self.usage.physical += job.gpus
            self.decision.admit.append(job.id)
            if host is not None:
                self.placement.admit_job(job, host)
                self.decision.hosts[job.id] = host if job.nodes == 1 else list(host)
        else:
            if host is not None:
                self.placement.hold_job(job, host)
            self.waiting_for[job.id] = (victims, host)
            self.reserving.setdefault(job.quota, job.id)

    def _drain_for(self, gang: Job) -> bool:
        """Keep hosts for ``gang``, which fits its quota but finds no hosts even once stopping jobs
        are gone, nor victims, if it is the gang that has waited longest of those waiting past the
        job queue's ``gang_reservation_after_s`` (Slurm's reservation for one job; the same gang
        every cycle until it starts, whichever quota the passes take first): the hosts expected to
        have room first by their jobs' expected runtimes, else those nearest to room. Nothing starts
        there but jobs expected to end before the last of them has room that leave the gang's
        capacity free (Slurm's backfill, :meth:`_backfill`), so they drain as their jobs end, and it
        starts once they have, if its quota still lets it. Only the hosts are held, not its
        capacity: until then the quota arithmetic is what it would be without it. Whether it kept
        them."""
        after = self.state.gang_reservation_after_s
        if after is None or self.drained_for is not None or self.now - gang.submitted_at < after:
            return False
        if self.longest_waiting_gang is None:
            self.longest_waiting_gang = min(  # not one rejected, started or held already: it needs none
                (job for job in self.backlog if job.nodes > 1 and job.id not in self.handled),
                key=lambda job: (job.submitted_at, job.id),
            ).id
        if gang.id != self.longest_waiting_gang:
            return False
        ends: dict[str, list[tuple[float, int]]] = defaultdict(list)
        taken = self.candidates.taken  # victims of this cycle: their GPUs are free once settled already
        for job in self.state.running:
            if job.preempted_for is None and job.id not in taken:
                end = _INF if job.expected_runtime_s is None else job.started_at + job.expected_runtime_s
                for host in job.placed_on:
                    ends[host].append((end, job.gpus_per_node))
        kept = self.placement.nearest_to_room(gang, ends, self.now)
        if kept is None:
            return False
        hosts, until = kept
        self.placement.hold_job(gang, hosts)
        self.drained_for = (gang, hosts, until)
        return True

    def _backfill(self, job: Job) -> str | None:
        """A host kept for a gang (:meth:`_drain_for`) where ``job``, on one host, starts now, is
        expected to end before the gang can start there and leaves the GPUs of the gang's quota
        arithmetic free, so it delays the gang by nothing if the runtimes hold (Slurm's backfill);
        None where there is none, or its runtime is unknown."""
        gang, hosts, until = self.drained_for
        if job.expected_runtime_s is None or self.now + job.expected_runtime_s > until:
            return None
        usage = self.usage
        if usage.physically_free() < job.gpus:  # it would wait there for stopping jobs
            return None
        usage.add(job.quota, job.gpus)
        leaves_room = usage.fits(gang.quota, gang.gpus, borrow=True)  # nor may it take the gang's capacity
        usage.remove(job.quota, job.gpus)
        return self.placement.backfill_host(job.gpus, hosts, gang.gpus_per_node) if leaves_room else None

    def _remember_no(self, memo: dict, job: Job, borrow: bool) -> None:
        if job.nodes > 1:
            return  # a gang fits hosts by its GPUs per node: its failure says nothing of larger jobs
        seen = memo.get((job.quota, borrow))
        if seen is None or seen[0] != self.epoch or job.gpus < seen[1]:
            memo[(job.quota, borrow)] = (self.epoch, job.gpus)

    def _failed_at_most(self, memo: dict, name: str, borrow: bool, gpus: int) -> bool:
        """Whether a job of quota ``name`` with at most ``gpus`` failed since the last change.

        Within one pass a quota's jobs come in queue order, and fitting is monotone in GPUs: a job at
        least as large as one that failed, with nothing changed since, fails too. Only jobs on one
        host are remembered and skipped: a gang fits hosts by its GPUs per node, whatever its size."""
        seen = memo.get((name, borrow))
        return seen is not None and seen[0] == self.epoch and seen[1] <= gpus

    def _next_open(self, name: str, borrow: bool, index: int) -> int:
        """The position of quota ``name``'s first job from ``index`` on that :meth:`_place` would not
        turn down from what it remembers: one smaller than a job that failed both to fit and to find
        victims since the last change (jobs at least that large wait too, whatever their place)."""
        fit = self._fit_failed.get((name, borrow))
        search = self._search_failed.get((name, borrow))
        if fit is None or search is None or fit[0] != self.epoch or search[0] != self.epoch or self.backlog.has_gangs(name):
            return index
        return self.backlog.next_smaller(name, index, max(fit[1], search[1]))

    def _closed(self, name: str, borrow: bool, priority: int) -> bool:
        """No job of quota ``name`` left in this pass can start, be held or find victims until the
        epoch changes: its smallest does not fit (fitting is monotone in GPUs, and usage only grows
        within an epoch), and a job no larger failed to find victims since the last change (so does
        the search, and in queue order in priority) or no rule can give any of its jobs left a victim.
        ``priority`` is that of the job the pass is at: its quota's jobs left come after it in queue
        order, so none has a higher one (a job held for its victims, often the quota's highest, is
        handled already and no reason to keep the quota open).

        With cohorts the borrowing pass takes a quota up again after the others' turns, by which time
        the epoch may have changed: there only what this epoch's jobs showed closes it, as before."""
        quota = self.quotas[name]
        if not borrow and self.usage.used[name] >= quota.capacity:
            return True  # neither fits within its capacity nor may search phase 1: borrowing pass
        smallest = self.backlog.smallest(name)
        failed_at_most = self._failed_at_most if not self.backlog.has_gangs(name) else _never_failed
        if borrow and self.usage.tree is not None:
            return failed_at_most(self._fit_failed, name, borrow, smallest) and (
                not _rules_allow_victims(quota, borrow) or failed_at_most(self._search_failed, name, borrow, smallest)
            )
        # The fit first: O(1) as well, and most quotas a pass closes do not fit (the memo is then moot).
        if self.usage.fits(name, smallest, borrow=borrow) and not failed_at_most(self._fit_failed, name, borrow, smallest):
            return False
        return (
            not _rules_allow_victims(quota, borrow)  # a quota without preemption (Airflow pools): no search
            or failed_at_most(self._search_failed, name, borrow, smallest)
            or self._no_victims(name, borrow, priority, smallest)
        )

    def _no_victims(self, name: str, borrow: bool, priority: int, smallest: int) -> bool:
        """No phase of the search this pass may try can find a victim for a job of quota ``name`` of
        at most ``priority`` asking for at least ``smallest`` GPUs: :func:`~.preemption.may_find`
        fails at the most they allow."""
        quota = self.quotas[name]
        own = self.candidates.own_at_most(priority, quota)
        if borrow and may_find(priority, smallest, own, quota, self.usage, borrow=True):
            return False  # phase 2
        return not (self.usage.below_share(name) and may_find(priority, smallest, own, quota, self.usage, borrow=False))

    def _place(self, job: Job, *, borrow: bool) -> bool:
        """Start, hold or preempt for ``job``; False when it has to wait."""
        quota = self.quotas[job.quota]
        single = job.nodes == 1
        unplaced_gang = False  # fits its quota, not the hosts: hosts may be kept for it if nothing else helps
        backfilling = False
        if not (single and self._failed_at_most(self._fit_failed, job.quota, borrow, job.gpus)):
            if self.usage.fits(job.quota, job.gpus, borrow=borrow):
                placement = self.placement
                host = None if placement is None else (
                    placement.host_for(job.gpus) if single else placement.hosts_for(job)
                )
                if self.placement is None or host is not None:
                    self._hold(job, [], host)  # starts now unless stopping victims still hold the GPUs
                    return True
                backfilling = single and self.drained_for is not None and self.drained_for[2] != _INF
                if backfilling and (host := self._backfill(job)) is not None:
                    held = self.drained_for[0].gpus_per_node
                    self.placement.hold(host, -held)  # the gang's hold let go for the job's start, then back
                    self._hold(job, [], host)
                    self.placement.hold(host, held)
                    return True
                unplaced_gang = not single
            if not backfilling:  # a shorter job of its size may still fit before the gang's start
                self._remember_no(self._fit_failed, job, borrow)
        victims = None
        if may_preempt(job, quota, self.now) and not (single and self._failed_at_most(self._search_failed, job.quota, borrow, job.gpus)):
            phases = search_phases(job, quota, self.usage)
            if not borrow:
                phases = [phase for phase in phases if not phase]
            # None without phases; with hosts, leaving room on a host
            victims = find_victims(job, quota, self.usage, self.candidates, phases, self.placement, may_borrow=borrow)
            if not victims:
                self._remember_no(self._search_failed, job, borrow)
        if not victims:
            return unplaced_gang and self._drain_for(job)
        awaited = []
        for victim, reason in victims:
            if self.candidates.finishing(victim):
                self._await(victim)
                awaited.append(victim.id)
            else:
                self._preempt(victim, job, reason)
        host = None
        if self.placement is not None:
            host = self._preemptor_place(job, (victim for victim, _ in victims), stopping=True)
        self._hold(job, [victim.id for victim, _ in victims if victim.id not in awaited], host, awaited)
        return True

    def _await(self, victim: Job) -> None:
        """Count ``victim``'s GPUs as the preemptor's, as :meth:`_preempt` does, without stopping it: it
        is expected to end within its grace period, as soon as a preemption would free them."""
        self.candidates.take(victim)
        self.usage.remove(victim.quota, victim.gpus)
        if self.placement is not None:
            self.placement.preempt(victim)
        self.epoch += 1

    def _preempt(self, victim: Job, preemptor: Job, reason: str) -> None:
        quota = self.quotas[victim.quota]
        self.candidates.take(victim)
        self.usage.remove(victim.quota, victim.gpus)
        if self.placement is not None:
            self.placement.preempt(victim)
        fail = limit_reached(victim, quota)
        message = ""
        if fail:
            limit = effective_max_preemptions(victim, quota)
            message = (
                f"preemption limit reached: preempted {victim.preemptions + 1} times, "
                f"max_preemptions is {limit} (quota {quota.name})"
            )
        self.decision.preempt.append(Preemption(victim.id, preemptor.id, reason, victim.quota, fail, message))
        self.epoch += 1

    def _within_quota_pass(self) -> None:
        """Every waiting job in queue order across quotas: start it or reclaim for it if it fits
        within its quota's capacity.

        A closed quota is set aside, and one whose next jobs would be turned down goes on at its first
        that would not (:meth:`_next_open`); when the epoch changes, both rejoin at their first job
        after the last one looked at (those they skipped would have failed)."""
        backlog, used = self.backlog, self.usage.used
        heap = []
        at: dict[str, int | None] = {}
        """Each quota's position in the heap; an entry at another one is stale (it rejoined earlier)."""
        aside: list[str] = []
        for name in backlog.quotas():
            if used[name] < self.quotas[name].capacity:
                heap.append((backlog.entries(name)[0][0], name, 0))
                at[name] = 0
            else:  # closed (:meth:`_closed`) until a preemption lowers its usage: no need to visit it
                aside.append(name)
                at[name] = None
        heapq.heapify(heap)
        epoch = self.epoch
        while heap:
            key, name, index = heapq.heappop(heap)
            if at[name] != index:
                continue
            at[name] = None
            entries = backlog.entries(name)
            job = entries[index][1]
            following = index + 1
            if job.id not in self.handled:
                if self._closed(name, False, job.priority):
                    aside.append(name)
                    continue
                if self._place(job, borrow=False):
                    self.handled.add(job.id)
                else:
                    following = self._next_open(name, False, following)
                    if following > index + 1:
                        aside.append(name)
            if following < len(entries):
                heapq.heappush(heap, (entries[following][0], name, following))
                at[name] = following
            if self.epoch != epoch:
                epoch = self.epoch
                for other in aside:
                    entries = backlog.entries(other)
                    index = bisect_right(entries, key, key=entry_key)
                    if index < len(entries) and (at[other] is None or index < at[other]):
                        heapq.heappush(heap, (entries[index][0], other, index))
                        at[other] = index
                aside.clear()

    def _borrowing_pass(self) -> None:
        """Place the rest, lowest borrowed share per weight first (with cohorts: nearest level first).

        A quota with a job held for GPUs not free yet (:attr:`reserving`) is left out: its jobs behind
        that one would borrow on top of the capacity held for it, and once its victims are gone it
        would no longer fit, preempt them in turn, and lose its host to its own victims, round and
        round (Kueue considers one job per queue per cycle, the head, so its lower ones wait too)."""
        backlog = self.backlog
        position = dict.fromkeys(backlog.quotas(), 0)
        tree = self.usage.tree is not None
        key = self.usage.share if not tree else lambda name: self._tree_key(name, position[name])
        # Entries carry the epoch they were keyed in: a flat quota's share changes only with its own
        # usage, which only its own admissions (it is pushed again after them) or its jobs taken as
        # victims (a new epoch) change. A cohort's level moves with its other quotas: always re-keyed.
        heap = [(key(name), name, self.epoch) for name in position]
        heapq.heapify(heap)
        while heap:
            share, name, epoch = heapq.heappop(heap)
            if name in self.reserving:
                continue
            if tree or epoch != self.epoch:
                current = key(name)
                if current != share:  # victims elsewhere changed it since it was pushed
                    heapq.heappush(heap, (current, name, self.epoch))
                    continue
            entries = backlog.entries(name)
            index = position[name]
            # A job that has to wait changes no share, so this quota stays first: go on with it, at its
            # next job that may not have to wait (with cohorts, the next job may borrow at another
            # level: back to the heap).
            while index < len(entries):
                job = entries[index][1]
                index += 1
                if job.id in self.handled:
                    continue
                if self._closed(name, True, job.priority):
                    index = len(entries)
                elif self._place(job, borrow=True):
                    self.handled.add(job.id)
                    break
                elif tree:
                    break
                else:
                    index = self._next_open(name, True, index)
            position[name] = index
            if index < len(entries):
                heapq.heappush(heap, (key(name), name, self.epoch))

    def _tree_key(self, name: str, index: int) -> tuple:
        """A quota's place in the borrowing pass with cohorts: the level its next waiting job borrows
        at (the deepest first), then its fair-sharing share."""
        entries = self.backlog.entries(name)
        while index < len(entries) and entries[index][1].id in self.handled:
            index += 1
        gpus = entries[index][1].gpus if index < len(entries) else 0
        return (-self.usage.lender_depth(name, gpus), self.usage.share(name))

    # -- why the rest wait ----------------------------------------------------------------------

    def _explain(self) -> None:
        admitted = set(self.decision.admit)
        explainer = Explainer(self.usage, self.quotas, self.candidates, self.now, self.placement)
        positions: dict[str, int] = defaultdict(int)
        prefix = f"{self.of_type}: " if self.of_type else ""
        for job in self.backlog.in_queue_order():
            drained = self.drained_for is not None and job.id == self.drained_for[0].id
            if job.id in admitted or (job.id in self.handled and job.id not in self.waiting_for and not drained):
                continue  # started, or rejected
            positions[job.quota] += 1
            if drained:
                reason = explainer.drained(job, *self.drained_for[1:], self.state.gang_reservation_after_s)
            elif job.id in self.waiting_for:
                awaited = [self.running.get(spared) for spared in self.awaiting.get(job.id, ())]
                reason = explainer.held(job, *self.waiting_for[job.id], awaited=awaited)
            else:
                # Every job still waiting went through the borrowing pass, which searched for
                # victims for each one allowed to preempt yet.
                quota = self.quotas[job.quota]
                holder = self.reserving.get(job.quota)
                if holder is None:
                    reason = explainer.waiting(job, searched=may_preempt(job, quota, self.now))
                else:
                    reason = explainer.waiting(job, searched=False) + (
                        f"; does not borrow while {holder} of its quota waits for GPUs held for it"
                    )
            if prefix:
                reason = prefix + reason
            self.decision.pending.append(Pending(job.id, positions[job.quota], reason, self.awaiting.get(job.id, [])))


# Read once: on Python 3.11 each ``Enum.MEMBER`` read goes through the enum metaclass's ``__getattr__``
# hook (~50 ns), and a replay asks this of each quota in most cycles.
_WITHIN_NEVER, _RECLAIM_NEVER = WithinQuota.NEVER, Reclaim.NEVER
_INF = float("inf")


def _never_failed(memo: dict, name: str, borrow: bool, gpus: int) -> bool:
    """:meth:`_Cycle._failed_at_most` for a quota with gangs waiting: what jobs on one host failed at
    does not close it."""
    return False


def _rules_allow_victims(quota: Quota, borrow: bool) -> bool:
    """Whether any rule of ``quota`` allows a victim at all in a pass (its ``borrow`` flag)."""
    policy = quota.preemption
    if policy.within_quota != _WITHIN_NEVER or policy.reclaim != _RECLAIM_NEVER:
        return True
    return borrow and policy.borrow_within is not None
