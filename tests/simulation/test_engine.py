"""The replay's own bookkeeping, apart from the figures it produces."""

from __future__ import annotations

import dataclasses

from airflow_quota_provider.policy import Job
from airflow_quota_provider.simulation.engine import Simulator, _changed
from airflow_quota_provider.simulation.policies import policy_setup
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
