"""The running jobs of one job queue: per quota, with the sums a cycle starts from (the GPUs they
hold, per quota and in all, and the victims still stopping for each preemptor).

:func:`~airflow_quota_provider.policy.decide` builds one from ``State.running`` when given a plain
list of jobs. A caller that decides often (the simulator) keeps one up to date between cycles
instead (:meth:`Running.add`, :meth:`Running.remove`, :meth:`Running.replace`) and passes it as
``State.running``: a cycle then starts from these sums, not from a walk over every running job.
``decide`` never changes it.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from itertools import accumulate

from airflow_quota_provider.policy.jobs import Job
from airflow_quota_provider.policy.ordering import saved_at
from airflow_quota_provider.policy.preemption_policy import stoppable


class Running:
    """Running jobs by quota, with what they hold counted as they come and go."""

    __slots__ = ("_jobs", "_by_quota", "physical", "in_use", "_stopping", "_stoppable", "_own_min_runtime",
                 "with_runtime", "_totals", "_started", "_unstarted", "_saved", "_ends", "_own_grace", "_types")

    def __init__(self, jobs: Iterable[Job] = ()) -> None:
        self._jobs: dict[str, Job] = {}
        self._by_quota: dict[str, dict[str, Job]] = {}
        self.physical = 0
        """GPUs all of them hold, stopping victims included."""
        self.in_use: dict[str, int] = {}
        """Per quota, the GPUs its jobs hold that are not stopping (only quotas holding some)."""
        self._stopping: dict[str, dict[str, Job]] = {}
        self._stoppable: dict[str, dict[int, int]] = {}
        self._own_min_runtime: dict[str, int] = {}
        self._totals: dict[str, tuple[list[int], list[int]]] = {}
        """:meth:`stoppable_totals` per quota, until its stoppable jobs change."""
        self.with_runtime = 0
        """How many have an expected runtime."""
        self._started: dict[str, list[tuple[int, float, str]]] = {}
        """Per quota, its jobs with a start time as ``(priority, -started_at, id)``, in order: the victim
        order but for its ties (:meth:`by_start`)."""
        self._unstarted: dict[str, int] = {}
        """Per quota, how many of its jobs have no start time."""
        self._saved: dict[str, list[tuple[int, float, str]]] = {}
        self._ends: dict[str, list[tuple[float, str]]] = {}
        """Per quota asked for :meth:`by_saved` once, its started jobs as ``(priority, -saved_at, id)`` and
        those with an expected runtime as ``(expected end, id)``, in order, kept from then on."""
        self._own_grace: dict[str, int] = {}
        """Per quota, how many of its jobs have a grace period of their own."""
        self._types: dict[str, Running] | None = None
        """Per GPU type, its running jobs (:meth:`of_type`), from the first call on."""
        for job in jobs:
            self._add(job)
            if job.started_at is not None:
                self._started.setdefault(job.quota, []).append(_start_key(job))
        for keys in self._started.values():
            keys.sort()

    @classmethod
    def of(cls, running: Iterable[Job]) -> Running:
        return running if isinstance(running, Running) else cls(running)

    def add(self, job: Job) -> None:
        self._add(job)
        if job.started_at is not None:
            insort(self._started.setdefault(job.quota, []), _start_key(job))
            self._by_work(job, insort)
        if self._types is not None and job.gpu_type is not None:
            self.of_type(job.gpu_type).add(job)

    def _add(self, job: Job) -> None:
        if job.id in self._jobs:
            raise ValueError(f"job {job.id!r} is already running")
        self._jobs[job.id] = job
        self._by_quota.setdefault(job.quota, {})[job.id] = job
        self._count(job, 1)

    def remove(self, job_id: str) -> Job:
        job = self._jobs.pop(job_id)
        jobs = self._by_quota[job.quota]
        del jobs[job_id]
        if not jobs:
            del self._by_quota[job.quota]
        if job.started_at is not None:
            _delete(self._started[job.quota], _start_key(job))
            self._by_work(job, _delete)
        self._count(job, -1)
        if self._types is not None and job.gpu_type is not None:
            self._types[job.gpu_type].remove(job_id)
        return job

    def replace(self, job: Job) -> None:
        """The running job of ``job.id`` is now ``job`` (chosen as a victim, or checkpointed)."""
        if _counted(self._jobs[job.id]) == _counted(job):  # most often a checkpoint
            self.swap(job)
            return
        self.remove(job.id)
        self.add(job)

    def swap(self, job: Job) -> None:
        """:meth:`replace` for a caller that knows nothing this object counts or orders by start changed
        (a checkpoint: only ``last_checkpoint_at``), without comparing."""
        saved = self._saved.get(job.quota)
        if saved is not None and job.started_at is not None:
            old = self._jobs[job.id]
            _delete(saved, _saved_key(old))
            insort(saved, _saved_key(job))
            if old.expected_runtime_s != job.expected_runtime_s:  # its expected end moves only with this
                self._by_work_end(old, _delete)
                self._by_work_end(job, insort)
        self._jobs[job.id] = self._by_quota[job.quota][job.id] = job
        if job.preempted_for is not None:
            self._stopping[job.preempted_for][job.id] = job
        if self._types is not None and job.gpu_type is not None:
            self._types[job.gpu_type].swap(job)

    def of_type(self, gpu_type: str) -> Running:
        """The running jobs on ``gpu_type`` (a job queue with GPU types decides each type on its own,
        :mod:`.types`), kept up to date with this object from the first call on, so that a caller that
        keeps it between cycles (the simulator) does not count every running job again each cycle."""
        if self._types is None:
            self._types = {}
            for job in self._jobs.values():
                if job.gpu_type is not None:
                    self._types.setdefault(job.gpu_type, Running()).add(job)
        by_type = self._types.get(gpu_type)
        if by_type is None:
            by_type = self._types[gpu_type] = Running()
        return by_type

    def _by_work(self, job: Job, change) -> None:
        """Insert (``insort``) or delete (:func:`_delete`) a started job's keys in :meth:`by_saved`'s
        lists, where its quota has them."""
        saved = self._saved.get(job.quota)
        if saved is not None:
            change(saved, _saved_key(job))
            self._by_work_end(job, change)

    def _by_work_end(self, job: Job, change) -> None:
        if job.expected_runtime_s is not None:
            change(self._ends[job.quota], _end_key(job))

    def _count(self, job: Job, sign: int) -> None:
        gpus = sign * job.gpus
        if job.started_at is None:
            _change(self._unstarted, job.quota, sign)
        if job.grace_period_s is not None:
            _change(self._own_grace, job.quota, sign)
        self.physical += gpus
        if job.expected_runtime_s is not None:
            self.with_runtime += sign
        if job.preempted_for is not None:
            victims = self._stopping.setdefault(job.preempted_for, {})
            if sign > 0:
                victims[job.id] = job
            else:
                del victims[job.id]
                if not victims:
                    del self._stopping[job.preempted_for]
            return
        _change(self.in_use, job.quota, gpus)
        if not stoppable(job):
            return
        self._totals.pop(job.quota, None)
        if job.min_runtime_s is None:
            _change(self._stoppable.setdefault(job.quota, {}), job.priority, gpus)
        else:
            _change(self._own_min_runtime, job.quota, sign)

    def get(self, job_id: str) -> Job | None:
        return self._jobs.get(job_id)

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def of_quota(self, quota: str) -> Iterable[Job]:
        """A quota's running jobs, stopping ones included."""
        jobs = self._by_quota.get(quota)
        return () if jobs is None else jobs.values()

    def by_start(self, quota: str) -> tuple[list[tuple[int, float, str]], dict[str, Job]] | None:
        """``quota``'s running jobs in order of priority, then latest start first, then id, as
        ``(priority, -started_at, id)`` keys, with its jobs by id to look them up; None when one of
        them has no start time. The victim order differs from this one only within its ties (equal
        priority and start), so a search that takes a few candidates sorts only the ties it reaches
        instead of every job (:class:`~.candidates.Candidates`)."""
        if self._unstarted.get(quota):
            return None
        return self._started.get(quota, []), self._by_quota.get(quota, {})

    def by_saved(
        self, quota: str
    ) -> tuple[list[tuple[int, float, str]], list[tuple[float, str]], dict[str, Job]] | None:
        """``quota``'s running jobs in order of priority, then latest saved first (:func:`saved_at`),
        then id, as ``(priority, -saved_at, id)`` keys; those with an expected runtime by their expected
        end, as ``(end, id)``; and its jobs by id. None when one has no start time or a grace period of
        its own. The victim order with expected runtimes (:func:`~.ordering.victim_order_by_work`) differs from
        the first only by the jobs expected to finish, which go first (found by their end), and within
        its ties (:class:`~.candidates.Candidates`).

        Built on the first call for a quota and kept up to date from then on: a caller that keeps this
        object (the simulator) sorts once, and one that never decides with runtimes, never."""
        if self._unstarted.get(quota) or self._own_grace.get(quota):
            return None
        saved = self._saved.get(quota)
        jobs = self._by_quota.get(quota, {})
        if saved is None:
            saved = self._saved[quota] = sorted(_saved_key(job) for job in jobs.values())
            self._ends[quota] = sorted(_end_key(job) for job in jobs.values() if job.expected_runtime_s is not None)
        return saved, self._ends[quota], jobs

    def preemptors(self) -> list[str]:
        """The jobs that victims still stopping were chosen for."""
        return list(self._stopping)

    def stopping_for(self, preemptor: str) -> list[Job]:
        """The victims still stopping for ``preemptor``."""
        return list(self._stopping.get(preemptor, {}).values())

    def has_own_min_runtime(self, quota: str) -> bool:
        """Whether one of ``quota``'s :func:`stoppable` jobs has a ``min_runtime_s`` of its own."""
        return bool(self._own_min_runtime.get(quota))

    def stoppable_totals(self, quota: str) -> tuple[list[int], list[int]] | None:
        """The GPUs of ``quota``'s :func:`stoppable` jobs by priority: the priorities in order and, per
        position, the GPUs of those below it (one more than the priorities); None when one of them has
        a ``min_runtime_s`` of its own (a rule that depends on ``now``, so this count cannot say).

        Kept until the quota's stoppable jobs change: a caller that keeps this object between cycles
        (the simulator) builds it once per change, not once per cycle."""
        totals = self._totals.get(quota)
        if totals is not None:
            return totals
        if self.has_own_min_runtime(quota):
            return None
        totals = self._totals[quota] = cumulative(self._stoppable.get(quota, {}))
        return totals


def cumulative(by_priority: dict[int, int]) -> tuple[list[int], list[int]]:
    """GPUs per priority as the priorities in order and the GPUs of those below each position."""
    priorities = sorted(by_priority)
    return priorities, [0, *accumulate(by_priority[p] for p in priorities)]


def _start_key(job: Job) -> tuple[int, float, str]:
    return (job.priority, -job.started_at, job.id)


def _saved_key(job: Job) -> tuple[int, float, str]:
    return (job.priority, -saved_at(job, job.started_at), job.id)


def _end_key(job: Job) -> tuple[float, str]:
    return (job.started_at + job.expected_runtime_s, job.id)


def _delete(keys: list, key: tuple) -> None:
    del keys[bisect_left(keys, key)]


def _counted(job: Job) -> tuple:
    """What :meth:`Running._count` and the start order read of a job."""
    return (job.quota, job.gpus, job.priority, job.preempted_for, job.preemptible, job.min_runtime_s is None,
            job.expected_runtime_s is None, job.started_at)


def _change(counts: dict, key: object, delta: int) -> None:
    """Add ``delta`` to ``counts[key]``, keeping only non-zero counts."""
    value = counts.get(key, 0) + delta
    if value:
        counts[key] = value
    else:
        counts.pop(key, None)
