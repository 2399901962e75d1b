"""The built-in checks fire: a policy (or bookkeeping) that breaks them makes the run an error."""

from __future__ import annotations

import pytest

from airflow_quota_provider.policy import Decision, decide
from airflow_quota_provider.simulation.checks import check_conservation, peak_demand
from airflow_quota_provider.simulation.engine import CheckError, Environment
from airflow_quota_provider.simulation.runner import simulate
from tests.simulation.builders import RECLAIM_JOBS, job, quota_file, two_quotas

ROOMY = [job(f"j{i}", "ab"[i % 2], i * 10, 55, 1) for i in range(6)]


def late_first_admission(state, now):
    """The real policy, except that the very first decision admits nobody."""
    decision = decide(state, now)
    if not late_first_admission.called:
        late_first_admission.called = True
        return Decision(admit=[], preempt=[], pending=decision.pending, reject=[])
    return decision


def test_zero_wait_check_fires_when_a_job_waits_despite_enough_capacity():
    late_first_admission.called = False
    quotas = quota_file(two_quotas(capacity=20, each=10))
    # With a 0-second delay the job is only admitted by a later event, 10 s after it arrived.
    with pytest.raises(CheckError, match=r"job 'j0' waited 10 s .* every quota of queue pool has at least its peak demand"):
        simulate(quotas, ROOMY, ["quota"], decide=late_first_admission)


def test_zero_wait_check_passes_with_the_real_policy():
    run = simulate(quota_file(two_quotas(capacity=20, each=10)), ROOMY, ["quota"])
    assert run.report["policies"]["quota"]["checks"]["zero_wait_queues"] == ["pool"]


def test_conservation_check_fires_when_served_work_differs_from_the_trace():
    run = simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["quota"], checkpoint_interval_s=100)
    result = run.results["quota"]
    check_conservation(result)  # as produced: balanced
    victim = next(j for j in result.jobs if j.trace.id == "b1")
    victim.lost -= 8 * 10  # pretend 10 s of lost work was served
    with pytest.raises(CheckError, match="team b was served 8080.000 GPU-seconds, its trace asks for 8000.000"):
        check_conservation(result)


def test_quota_time_integral_must_match_its_jobs():
    run = simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["quota"], checkpoint_interval_s=100)
    result = run.results["quota"]
    result.usage["a"].busy_area += 1.0
    with pytest.raises(CheckError, match="quota a held 401.000 GPU-seconds over time, its jobs held 400.000"):
        check_conservation(result)


def test_a_policy_that_never_admits_leaves_jobs_stuck_and_fails_the_run():
    def never(state, now):
        return Decision(admit=[], preempt=[], pending=decide(state, now).pending, reject=[])

    with pytest.raises(CheckError, match=r"quota: 2 job\(s\) never finished .* 'b1' \(8 GPUs, quota b\)"):
        simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["quota"], decide=never)


def test_a_policy_that_overfills_the_queue_fails_the_run():
    def everyone(state, now):
        return Decision(admit=[j.id for j in state.pending], preempt=[], pending=[], reject=[])

    jobs = [job("x", "a", 0, 10, 8), job("y", "b", 0, 10, 4)]
    with pytest.raises(CheckError, match="queue pool would use 12 GPUs of 8"):
        simulate(quota_file(two_quotas()), jobs, ["quota"], decide=everyone)


def test_a_policy_that_admits_an_unknown_job_fails_the_run():
    def ghost(state, now):
        return Decision(admit=["ghost"], preempt=[], pending=[], reject=[])

    with pytest.raises(CheckError, match="policy tried to admit 'ghost', which is not pending in queue pool"):
        simulate(quota_file(two_quotas()), RECLAIM_JOBS, ["quota"], decide=ghost)


def test_peak_demand_counts_ends_before_starts():
    class Sim:
        def __init__(self, trace):
            self.trace = trace

    jobs = [Sim(job("a", "t", 0, 10, 3)), Sim(job("b", "t", 10, 5, 4)), Sim(job("c", "t", 12, 5, 2))]
    assert peak_demand(jobs) == 6


def test_environment_orders_by_time_then_priority_then_insertion():
    env = Environment()
    seen = []
    env.schedule(5, 2, seen.append, "late arrival")
    env.schedule(5, 0, seen.append, "finish")
    env.schedule(1, 3, seen.append, "early decide")
    env.schedule(5, 0, seen.append, "second finish")
    assert env.peek() == 1
    env.run(until=5)
    assert (seen, env.now) == (["early decide"], 5.0)
    env.run()
    assert seen == ["early decide", "finish", "second finish", "late arrival"]
    with pytest.raises(ValueError, match=r"until=3 must be a time at or after now \(5.0\)"):
        env.run(until=3)
    with pytest.raises(ValueError, match="cannot schedule at 4, before now"):
        env.schedule(4, 0, seen.append, "past")
