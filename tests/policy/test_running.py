"""The running jobs kept between cycles: what a kept object counts equals what one built from the same
jobs counts, per GPU type too (:meth:`Running.of_type`)."""

from __future__ import annotations

import random
from dataclasses import replace

from airflow_quota_provider.policy.running import Running
from tests.policy.builders import running

TYPES = ("h100", "a100")


def figures(kept: Running) -> tuple:
    quotas = sorted({job.quota for job in kept})
    return (sorted(kept, key=lambda job: job.id), kept.physical, dict(kept.in_use), sorted(kept.preemptors()),
            [kept.stoppable_totals(q) for q in quotas], [kept.by_start(q) for q in quotas])


def test_a_kept_objects_jobs_of_a_type_count_as_those_jobs_built_afresh():
    rng = random.Random(3)
    kept = Running()
    by_type_asked_at = 40  # before: kept without types; from then on, both kept
    for step in range(400):
        if step == by_type_asked_at:
            for gpu_type in TYPES:
                kept.of_type(gpu_type)
        jobs = list(kept)
        roll = rng.random()
        if not jobs or roll < 0.45:
            kept.add(running(f"j{step}", rng.choice("ab"), rng.choice([1, 2, 4]), rng.choice([0, 10]),
                             started_at=float(step), gpu_type=rng.choice(TYPES)))
        elif roll < 0.7:
            kept.remove(rng.choice(jobs).id)
        elif roll < 0.85:  # chosen as a victim
            job = rng.choice(jobs)
            kept.replace(replace(job, preempted_for=f"p{step}"))
        else:  # checkpointed
            job = rng.choice(jobs)
            kept.replace(replace(job, last_checkpoint_at=float(step)))
        if step >= by_type_asked_at:
            for gpu_type in TYPES:
                afresh = Running(job for job in kept if job.gpu_type == gpu_type)
                assert figures(kept.of_type(gpu_type)) == figures(afresh), (step, gpu_type)
