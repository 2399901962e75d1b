"""The replay's own bookkeeping, apart from the figures it produces."""

from __future__ import annotations

import dataclasses

from airflow_quota_provider.policy import Job
from airflow_quota_provider.simulation.engine import _changed

RUNNING = Job(id="j1", quota="a", gpus=2, priority=5, submitted_at=1.0, started_at=3.0, last_checkpoint_at=3.0,
              expected_runtime_s=60.0, host="pool-1")


def test_a_changed_job_is_the_one_replace_builds():
    assert not hasattr(Job, "__post_init__"), "_changed copies fields: a Job must compute nothing at init"
    changes = {"last_checkpoint_at": 9.0, "preempted_for": "j2", "preemptions": 1}
    changed = _changed(RUNNING, **changes)
    assert changed == dataclasses.replace(RUNNING, **changes)
    assert dataclasses.asdict(changed) == {**dataclasses.asdict(RUNNING), **changes}
    assert RUNNING.last_checkpoint_at == 3.0 and RUNNING.preempted_for is None, "the job itself is unchanged"
