"""Victim lists: each quota's candidates in victim order, built from a kept start order only as far
as a search reaches, and the same list as sorting every candidate."""

from __future__ import annotations

import random
from dataclasses import replace

from airflow_quota_provider.policy.candidates import Candidates
from airflow_quota_provider.policy.ordering import victim_order, victim_order_by_work
from airflow_quota_provider.policy.preemption_policy import finishes_within_grace, may_reclaim_from
from airflow_quota_provider.policy.running import Running
from tests.policy.builders import quota, running

NOW = 1000.0


def whole_sort(jobs, now: float = NOW, by_work_of=None) -> list[str]:
    """The victim order by its definition: every stoppable job keyed and sorted (with ``by_work_of``, a
    quota, in the order with expected runtimes)."""
    def key(job):
        if by_work_of is None:
            return victim_order(job, now)
        return victim_order_by_work(job, now, finishes_within_grace(job, by_work_of, now))
    return [job.id for job in sorted((j for j in jobs if j.preemptible and j.preempted_for is None), key=key)]


def many_ties(rng: random.Random, count: int) -> list:
    """Jobs sharing priorities and start times (one cycle admits several at once), with different sizes
    and checkpoints, so that the order within a tie is decided by the work they would lose."""
    return [
        running(f"j{i:03d}", "a", rng.choice([1, 2, 4, 8]), rng.choice([10, 50, 100]),
                started_at=float(rng.choice([100, 200, 300])),
                last_checkpoint_at=rng.choice([None, 400.0, 700.0, NOW]),
                preemptible=rng.random() > 0.1)
        for i in range(count)
    ]


def ids(candidates: Candidates, name: str) -> list[str]:
    return [job.id for _, job in candidates.entries(name)]


def test_a_list_built_tie_by_tie_from_the_start_order_equals_the_whole_sort():
    rng = random.Random(7)
    jobs = many_ties(rng, 120)
    kept = Running(jobs)
    assert ids(Candidates(kept, {"a": quota("a", 8)}, NOW), "a") == whole_sort(jobs)
    # Kept between cycles: the start order follows jobs that come, go, checkpoint or are told to stop.
    for job in rng.sample(jobs, 30):
        kept.remove(job.id)
        jobs.remove(job)
    for i, job in enumerate(rng.sample(jobs, 30)):
        changed = replace(job, last_checkpoint_at=NOW - 1) if i % 2 else replace(job, preempted_for="p", priority=99)
        kept.replace(changed)
        jobs[jobs.index(job)] = changed
    newcomers = many_ties(random.Random(8), 10)
    for job in newcomers:
        kept.add(replace(job, id=f"n{job.id}"))
        jobs.append(replace(job, id=f"n{job.id}"))
    for now in (NOW, NOW + 500.0):
        assert ids(Candidates(kept, {"a": quota("a", 8)}, now), "a") == whole_sort(jobs, now)


def test_a_search_that_takes_the_first_candidates_keys_only_the_ties_it_reaches():
    jobs = [running(f"j{i:03d}", "a", 1, 10 if i < 3 else 50, started_at=float(i)) for i in range(200)]
    candidates = Candidates(Running(jobs), {"a": quota("a", 8)}, NOW)
    assert candidates.lowest_priority("a") == 10
    candidates.take(jobs[2])  # the latest started of the lowest priority comes first
    assert candidates.lowest_priority("a") == 10
    assert len(candidates._sorted["a"]) < 10, "the list was built past the candidates asked for"
    assert ids(candidates, "a") == whole_sort(jobs)


def test_a_job_without_a_start_time_sorts_the_whole_list_as_before():
    jobs = [running("started", "a", 1, 5, started_at=10.0), running("unstarted", "a", 2, 5, started_at=None)]
    kept = Running(jobs)
    assert kept.by_start("a") is None
    # An unstarted job counts as started now, after every job started earlier.
    assert ids(Candidates(kept, {"a": quota("a", 8)}, NOW), "a") == ["unstarted", "started"] == whole_sort(jobs)
    kept.remove("unstarted")
    assert kept.by_start("a") is not None


def test_quotas_whose_rules_spare_jobs_by_time_keep_sorting_every_candidate():
    # min_runtime_s spares a job by now, which the start order cannot say: the list is built whole.
    jobs = [running("young", "a", 1, 5, started_at=NOW - 5), running("old", "a", 1, 5, started_at=0.0)]
    candidates = Candidates(Running(jobs), {"a": quota("a", 8, min_runtime_s=60)}, NOW)
    assert ids(candidates, "a") == ["old"]


def with_runtimes(rng: random.Random, count: int, prefix: str = "j") -> list:
    """Jobs with expected runtimes, some ending around ``NOW`` (within a 120 s grace or a 300 s spare
    window, before or after it), sharing priorities, starts and checkpoints."""
    jobs = []
    for i in range(count):
        started = float(rng.choice([100, 200, 300, 900]))
        end = rng.choice([NOW - 400, NOW - 250, NOW - 100, NOW, NOW + 60, NOW + 120, NOW + 200, NOW + 5000])
        jobs.append(running(f"{prefix}{i:03d}", "a", rng.choice([1, 2, 4]), rng.choice([10, 50]), started_at=started,
                            last_checkpoint_at=rng.choice([None, 50.0, 400.0, 950.0, NOW]),
                            expected_runtime_s=None if rng.random() < 0.2 else max(1.0, end - started),
                            preemptible=rng.random() > 0.1))
    return jobs


def test_with_runtimes_a_list_built_group_by_group_from_the_saved_order_equals_the_whole_sort():
    rng = random.Random(11)
    jobs = with_runtimes(rng, 150)
    kept = Running(jobs)
    for spare in (0.0, 300.0):
        owner = quota("a", 8, spare_finishing_within_s=spare)
        candidates = Candidates(kept, {"a": owner}, NOW)
        assert candidates.by_work
        assert ids(candidates, "a") == whole_sort(jobs, by_work_of=owner)
    assert kept.by_saved("a") is not None, "the jobs keep the saved order the lists are built from"
    # Kept between cycles: the saved order follows jobs that come, go, checkpoint or are told to stop.
    for job in rng.sample(jobs, 30):
        kept.remove(job.id)
        jobs.remove(job)
    for i, job in enumerate(rng.sample(jobs, 40)):
        changed = replace(job, last_checkpoint_at=NOW - i) if i % 2 else replace(job, preempted_for="p", priority=99)
        if i % 2:
            kept.swap(changed)  # as the simulator notes a checkpoint
        else:
            kept.replace(changed)
        jobs[jobs.index(job)] = changed
    for job in with_runtimes(random.Random(12), 20, prefix="n"):
        kept.add(job)
        jobs.append(job)
    for now in (NOW, NOW + 150.0, NOW + 1000.0):
        for spare in (0.0, 300.0):
            owner = quota("a", 8, spare_finishing_within_s=spare)
            assert ids(Candidates(kept, {"a": owner}, now), "a") == whole_sort(jobs, now, by_work_of=owner)


def test_with_runtimes_a_job_with_a_grace_period_of_its_own_sorts_the_whole_list():
    # Both end at 1400: within "own"'s 600 s grace period, not within the quota's 120 s.
    ending = {"started_at": 900.0, "expected_runtime_s": 500.0}
    jobs = with_runtimes(random.Random(13), 20) + [running("own", "a", 1, 1, grace_period_s=600.0, **ending),
                                                   running("plain", "a", 1, 1, **ending)]
    kept = Running(jobs)
    assert kept.by_saved("a") is None
    owner = quota("a", 8)
    assert ids(Candidates(kept, {"a": owner}, NOW), "a") == whole_sort(jobs, by_work_of=owner)
    assert ids(Candidates(kept, {"a": owner}, NOW), "a")[:2] == ["own", "plain"], "expected to finish: first"


def test_a_lender_that_never_reclaims_reaches_no_borrower():
    borrower = running("b", "team-b", 1, priority=0)
    assert not may_reclaim_from(quota("team-a", 4, reclaim="never"), borrower)
    assert not may_reclaim_from(quota("team-a", 4, reclaim="never", max_priority=100), borrower)


def test_a_lender_whose_jobs_have_no_priority_ceiling_may_reclaim_from_any_borrower():
    borrower = running("b", "team-b", 1, priority=10**6)
    assert may_reclaim_from(quota("team-a", 4, reclaim="lower_priority"), borrower)
    assert may_reclaim_from(quota("team-a", 4, reclaim="any", max_priority=0), borrower)


def test_a_lender_reclaiming_lower_priority_reaches_borrowers_below_its_highest_priority():
    lender = quota("team-a", 4, reclaim="lower_priority", max_priority=50)
    assert may_reclaim_from(lender, running("b", "team-b", 1, priority=49))
    assert not may_reclaim_from(lender, running("b", "team-b", 1, priority=50))
