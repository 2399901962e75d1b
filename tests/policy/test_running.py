"""The running jobs kept between cycles: what a kept object counts equals what one built from the same
jobs counts, per GPU type too (:meth:`Running.of_type`), and a typed replay decides from kept objects
(Backlog's per type too, tests/policy/test_backlog.py) as from lists."""

from __future__ import annotations

import random
from dataclasses import replace

from airflow_quota_provider.policy import decide
from airflow_quota_provider.policy.backlog import Backlog
from airflow_quota_provider.policy.running import Running
from airflow_quota_provider.simulation.engine import Simulator
from airflow_quota_provider.simulation.policies import policy_setup
from airflow_quota_provider.simulation.typesplit import draw_gpu_types
from tests.policy.builders import running
from tests.simulation.builders import job, quota_file

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


def test_a_typed_replay_decides_from_kept_jobs_as_from_the_same_jobs_listed():
    """The simulator keeps its running and waiting jobs between cycles (per GPU type too); every
    decision of a typed replay equals the one made from plain lists of the same jobs."""
    shares = {"capacity": {"h100": 4, "a100": 6}, "sharing": "lend_and_borrow",
              "preemption": {"within_quota": "lower_priority", "reclaim": "any"}, "grace_period_s": 20}
    typed = quota_file({"queues": [{"name": "pool", "capacity": {"h100": 8, "a100": 12},
                                    "quotas": [{"name": "a", **shares}, {"name": "b", **shares}]}]})
    rng = random.Random(11)
    jobs = [job(f"j{n}", rng.choice("ab"), n * 7.0, rng.choice([30, 120, 400]), rng.choice([1, 2, 4, 6]),
                priority=rng.choice([0, 10])) for n in range(160)]
    compared = []

    def both(state, now):
        kept = decide(state, now)
        listed = decide(replace(state, running=tuple(state.running), pending=tuple(state.pending)), now)
        assert (kept.admit, kept.preempt, kept.types, kept.reject, [(p.id, p.reason) for p in kept.pending]) == (
            listed.admit, listed.preempt, listed.types, listed.reject, [(p.id, p.reason) for p in listed.pending])
        compared.append(isinstance(state.pending, Backlog))
        return kept

    for drawn in (draw_gpu_types(jobs, {"h100": 0.4, "a100": 0.6}, seed=2), jobs):  # all asking one type; none
        result = Simulator(typed, policy_setup(typed, "quota"), drawn, checkpoint_interval_s=50, decide=both).run()
        assert {j.status for j in result.jobs} == {"completed"}
    assert len(compared) > 100 and all(compared)
