"""One decision cycle: ``decide(state, now) -> Decision``.

The cycle, in order:

1. Jobs rejected outright (more GPUs than their quota can ever hold, priority above ``max_priority``).
2. Jobs holding capacity while their victims stop: their GPUs are counted as taken (logically), and
   they wait until their victims are gone, even when other GPUs are free (those are someone else's).
   Once the victims have stopped the job is an ordinary waiting job that fits, and starts. (If the
   quota file changed so that the hold no longer fits, the job queues again like any other.)
3. Within-quota pass, in queue order (priority, then FIFO): a job that fits within its own quota's
   capacity starts; one that would fit but finds its lent capacity in use reclaims it (phase 1 of
   the victim search). Non-borrowing admissions go before borrowing ones, as in Kueue, so a reclaim
   is never undone by a borrower in the same cycle.
4. Borrowing pass, in fair-share order (borrowed GPUs per unit of weight, lowest first, recomputed
   after every admission): the rest start if they may borrow, or search for victims (both phases).
5. Every job still waiting gets its position in its quota's queue and a reason.

As many jobs start per cycle as fit. The input is never mutated and the result depends on nothing
but ``(state, now)``.
"""

from __future__ import annotations

import heapq
from collections import defaultdict, deque

from airflow_quota_provider.policy.candidates import Candidates
from airflow_quota_provider.policy.capacity import Usage, ever_fits
from airflow_quota_provider.policy.config import Quota
from airflow_quota_provider.policy.decision import Decision, Pending, Preemption, Rejection
from airflow_quota_provider.policy.ordering import queue_order
from airflow_quota_provider.policy.preemption import find_victims, search_phases
from airflow_quota_provider.policy.preemption_policy import effective_max_preemptions, limit_reached, may_preempt
from airflow_quota_provider.policy.reasons import Explainer
from airflow_quota_provider.policy.state import Job, State


def decide(state: State, now: float) -> Decision:
    """Decide which pending jobs start, which running jobs are preempted, and why the rest wait."""
    return _Cycle(state, now).run()


def rejection_reason(job: Job, quota: Quota, state: State, most: int | None = None) -> str | None:
    """Why ``job`` can never run on ``quota`` under this configuration, or None.

    ``most`` is :func:`ever_fits` for the quota, when the caller has it already.
    """
    if quota.max_priority is not None and job.priority > quota.max_priority:
        return f"priority {job.priority} is above quota {quota.name}'s max_priority {quota.max_priority}"
    if most is None:
        most = ever_fits(quota, state.quotas, state.capacity)
    if job.gpus > most:
        return (
            f"asks for {job.gpus} GPUs; quota {quota.name} can never hold more than {most} "
            f"(capacity {quota.capacity}, sharing {quota.sharing}"
            + (f", borrow_limit {quota.borrow_limit}" if quota.borrow_limit is not None else "")
            + f", job queue capacity {state.capacity})"
        )
    return None


class _Cycle:
    def __init__(self, state: State, now: float) -> None:
        self.state = state
        self.now = now
        self.quotas = {q.name: q for q in state.quotas}
        self._most: dict[str, int] = {}
        self.usage = Usage(state.capacity, state.quotas)
        self.stopping_for: dict[str, list[str]] = defaultdict(list)
        # The hottest loop of a cycle (the simulator makes ~10^5 cycles): locals, one pass.
        in_use: dict[str, int] = defaultdict(int)
        physical = 0
        for job in state.running:
            gpus = job.gpus
            physical += gpus
            if job.preempted_for is None:
                in_use[job.quota] += gpus
            else:
                self.stopping_for[job.preempted_for].append(job.id)
        self.usage.physical = physical
        for name, gpus in in_use.items():
            self.usage.add(name, gpus)
        self.candidates = Candidates(state.running, self.quotas, now)
        self.decision = Decision()
        self.waiting_for: dict[str, list[str]] = {}
        """Held jobs: capacity is theirs, GPUs not yet free; the victims they wait for."""
        self.epoch = 0
        """Counts the changes that can make a failed fit or search succeed (preemptions, a quota
        starting to borrow); failures memoised at one epoch stay failures until the next."""
        self._fit_failed: dict[tuple[str, bool], tuple[int, int]] = {}
        self._search_failed: dict[tuple[str, bool], tuple[int, int]] = {}
        self.no_victims: set[str] = set()
        """Jobs whose victim search found nothing (or could not run); for their pending reason."""

    def run(self) -> Decision:
        ordered = sorted(self.state.pending, key=queue_order)
        waiting: list[Job] = []
        for job in ordered:
            most = self._most.get(job.quota)
            if most is None:
                most = self._most[job.quota] = ever_fits(self.quotas[job.quota], self.state.quotas, self.state.capacity)
            reason = rejection_reason(job, self.quotas[job.quota], self.state, most)
            if reason is not None:
                self.decision.reject.append(Rejection(job.id, reason))
            elif job.id in self.stopping_for and self.usage.fits(job.quota, job.gpus, borrow=True):
                # Held from an earlier cycle; re-checked, since the quota file may have changed since.
                self._hold(job, sorted(self.stopping_for[job.id]))
            else:
                waiting.append(job)
        deferred = [job for job in waiting if not self._place(job, borrow=False)]
        self._borrowing_pass(deferred)
        self._explain(ordered)
        return self.decision

    # -- placing one job ------------------------------------------------------------------------

    def _take(self, job: Job) -> None:
        """Count ``job``'s GPUs against its quota.

        Taking capacity only makes later fits and searches harder, except that a quota starting to
        borrow makes its running jobs reclaim candidates: only that invalidates memoised failures.
        """
        was_borrowing = self.usage.is_borrowing(job.quota)
        self.usage.add(job.quota, job.gpus)
        if not was_borrowing and self.usage.is_borrowing(job.quota):
            self.epoch += 1

    def _hold(self, job: Job, victims: list[str]) -> None:
        """Count ``job``'s GPUs as taken. A job with victims waits for them to stop, even if other
        GPUs are free right now (they belong to others); one without starts if the GPUs are free."""
        self._take(job)
        if not victims and self.usage.physically_free() >= job.gpus:
            self.usage.physical += job.gpus
            self.decision.admit.append(job.id)
        else:
            self.waiting_for[job.id] = victims

    def _memo_says_no(self, memo: dict, job: Job, borrow: bool) -> bool:
        # Within one pass a quota's jobs come in queue order, and fitting is monotone in GPUs: a job
        # at least as large as one that failed, with nothing changed since, fails too.
        seen = memo.get((job.quota, borrow))
        return seen is not None and seen[0] == self.epoch and job.gpus >= seen[1]

    def _remember_no(self, memo: dict, job: Job, borrow: bool) -> None:
        seen = memo.get((job.quota, borrow))
        if seen is None or seen[0] != self.epoch or job.gpus < seen[1]:
            memo[(job.quota, borrow)] = (self.epoch, job.gpus)

    def _hopeless(self, name: str) -> bool:
        """No later job of quota ``name`` can start or find victims in this pass: a 1-GPU job failed
        both since the last change (fitting and the search are monotone in GPUs and priority)."""
        fit = self._fit_failed.get((name, True))
        search = self._search_failed.get((name, True))
        return (
            fit is not None and fit == (self.epoch, 1) and search is not None and search == (self.epoch, 1)
        )

    def _place(self, job: Job, *, borrow: bool) -> bool:
        """Start, hold or preempt for ``job``; False when it has to wait."""
        quota = self.quotas[job.quota]
        if not borrow and self.usage.used[job.quota] >= quota.capacity:
            return False  # neither fits within its capacity nor may search phase 1: borrowing pass
        if not self._memo_says_no(self._fit_failed, job, borrow):
            if self.usage.fits(job.quota, job.gpus, borrow=borrow):
                self._hold(job, [])  # starts now unless stopping victims still hold the GPUs
                return True
            self._remember_no(self._fit_failed, job, borrow)
        if not may_preempt(job, quota, self.now):
            return False
        phases = search_phases(job, quota, self.usage)
        if not borrow:
            phases = [phase for phase in phases if not phase]
        if not phases or self._memo_says_no(self._search_failed, job, borrow):
            self.no_victims.add(job.id)
            return False
        victims = find_victims(job, quota, self.usage, self.candidates, phases)
        if not victims:
            self._remember_no(self._search_failed, job, borrow)
            self.no_victims.add(job.id)
            return False
        for victim, reason in victims:
            self._preempt(victim, job, reason)
        self._hold(job, [victim.id for victim, _ in victims])
        return True

    def _preempt(self, victim: Job, preemptor: Job, reason: str) -> None:
        quota = self.quotas[victim.quota]
        self.candidates.taken.add(victim.id)
        self.usage.remove(victim.quota, victim.gpus)
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

    def _borrowing_pass(self, jobs: list[Job]) -> None:
        """Place the rest, lowest borrowed share per weight first."""
        queues: dict[str, deque[Job]] = defaultdict(deque)
        for job in jobs:
            queues[job.quota].append(job)
        heap = [(self.usage.share(name), name) for name in queues]
        heapq.heapify(heap)
        while heap:
            share, name = heapq.heappop(heap)
            current = self.usage.share(name)
            if current != share:  # victims elsewhere changed it since it was pushed
                heapq.heappush(heap, (current, name))
                continue
            waiting = queues[name]
            quota = self.quotas[name]
            # A job that has to wait changes no share, so this quota stays first: go on with it.
            while waiting and not self._place(waiting.popleft(), borrow=True):
                if self._hopeless(name):
                    # What _place would conclude for each of the rest, without asking it each time.
                    self.no_victims.update(job.id for job in waiting if may_preempt(job, quota, self.now))
                    waiting.clear()
            if waiting:
                heapq.heappush(heap, (self.usage.share(name), name))

    # -- why the rest wait ----------------------------------------------------------------------

    def _explain(self, ordered: list[Job]) -> None:
        admitted = set(self.decision.admit)
        rejected = {r.id for r in self.decision.reject}
        explainer = Explainer(self.usage, self.quotas, self.candidates, self.now)
        positions: dict[str, int] = defaultdict(int)
        for job in ordered:
            if job.id in admitted or job.id in rejected:
                continue
            positions[job.quota] += 1
            if job.id in self.waiting_for:
                reason = explainer.held(job, self.waiting_for[job.id])
            else:
                reason = explainer.waiting(job, searched=job.id in self.no_victims)
            self.decision.pending.append(Pending(job.id, positions[job.quota], reason))
