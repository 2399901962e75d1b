"""The replay's own bookkeeping, apart from the figures it produces."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_quota_provider.policy import Job, Preemption, PreemptionReason, decide as policy_decide
from airflow_quota_provider.simulation.engine import CheckError, Simulator, _changed, checkpoint_times
from airflow_quota_provider.simulation.policies import policy_setup
from airflow_quota_provider.simulation.workload import kueue_baseline
from tests.simulation.builders import job, quota_file, two_quotas

RUNNING = Job(id="j1", quota="a", gpus=2, priority=5, submitted_at=1.0, started_at=3.0, last_checkpoint_at=3.0,
              expected_runtime_s=60.0, host="pool-1")


def test_a_changed_job_is_the_one_replace_builds():
    assert not hasattr(Job, "__post_init__"), "_changed copies fields: a Job must compute nothing at init"
    changes = {"last_checkpoint_at": 9.0, "preempted_for": "j2", "preemptions": 1}
    changed = _changed(RUNNING, **changes)
    assert changed == dataclasses.replace(RUNNING, **changes)
    assert dataclasses.asdict(changed) == {**dataclasses.asdict(RUNNING), **changes}
    assert RUNNING.last_checkpoint_at == 3.0 and RUNNING.preempted_for is None, "the job itself is unchanged"


def test_the_replay_asks_again_when_a_spared_job_outlives_its_estimate_and_window():
    # b1 borrows all 8 GPUs from 0 for 1000 s but is expected to take 800: spared from 700 (100 s
    # before its expected end) to 900 (100 s after). a1 reclaims 4 at 850 and waits for it; at 900
    # nothing happens but time passing, and the replay must preempt then (stop at 930), as the
    # executor's next cycle would, not wait for b1's own end at 1000.
    config = quota_file(two_quotas(grace=30.0, spare_finishing_within_s=100.0))
    jobs = [job("b1", "b", 0, 1000, 8), job("a1", "a", 850, 100, 4)]
    simulator = Simulator(config, policy_setup(config, "quota"), jobs, runtime_noise=0.0)
    simulator.jobs["b1"].estimate_factor = 0.8
    result = simulator.run()
    by_id = {j.trace.id: j for j in result.jobs}
    assert by_id["b1"].preemptions == 1
    assert by_id["a1"].first_start == 930.0


def test_the_next_checkpoint_is_after_now_where_the_division_rounds_below_a_whole_number():
    assert (4.1 - 0.2) / 0.3 < 13  # 12.999...: floor alone would say 12 checkpoints, the 13th at 4.1
    last, following = checkpoint_times(0.2, 4.1, 0.3)
    assert last <= 4.1 < following
    assert round((last - 0.2) / 0.3) == 13
    for start in (0.0, 0.1, 0.2, 0.4, 0.7000000000000001, 0.8, 3.3):
        for n in range(1, 40):
            now = start + n * 0.3
            last, following = checkpoint_times(start, now, 0.3)
            assert start <= last <= now < following, (start, now)


def test_a_replay_with_a_sub_second_checkpoint_interval_ends():
    # Kueue's jobs run 0.2-1 s; with a checkpoint every 0.3 s the replay once refreshed a checkpoint
    # at a time (start + whole intervals) whose division rounded down, forever.
    config, jobs = kueue_baseline(spare_finishing_within_s=0.5)
    jobs = sorted(jobs, key=lambda j: j.submit_time_s)[:1000]
    result = Simulator(config, policy_setup(config, "quota"), jobs, checkpoint_interval_s=0.3, runtime_noise=0.5).run()
    assert all(j.status == "completed" for j in result.jobs)
    assert sum(j.preemptions for j in result.jobs) > 0


def test_a_policy_that_goes_round_in_circles_at_one_instant_stops_the_replay_naming_it():
    """With a grace period of 0 a victim stops, and waits again, at the instant it was preempted: a
    policy that each time also preempts another running job would replay that instant for ever."""
    config = quota_file(two_quotas(capacity=8, each=4, grace=0.0))
    jobs = [job(f"a{i}", "a", 0, 100, 4) for i in range(3)] + [job("a3", "a", 1, 100, 4)]

    def restless(state, now):
        decision = policy_decide(state, now, explain=False)
        running = [j for j in state.running if j.preempted_for is None]
        if running and state.pending:
            victim, waiting = running[0], next(iter(state.pending))
            decision.preempt.append(Preemption(victim.id, waiting.id, PreemptionReason.WITHIN_QUOTA, victim.quota))
        return decision

    with pytest.raises(CheckError, match=r"queue pool made \d+ decisions that preempt at t=1 s without time moving on.*round in circles"):
        Simulator(config, policy_setup(config, "quota"), jobs, decide=restless, runtime_noise=0.0).run()

