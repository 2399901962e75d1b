"""The live figures of :mod:`airflow_quota_provider.usage` over a seeded SQLite database: a typed job
queue's quotas per GPU type, and an untyped queue's as before."""

from __future__ import annotations

import pytest
import yaml
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from airflow_quota_provider.models.base import quota_metadata
from airflow_quota_provider.policy import CohortUsage, QuotaUsage, parse_quota_file
from airflow_quota_provider.usage import cohort_rows, idle, quota_rows
from tests.plugins.seed import seed_into

TYPED_QUOTAS = """
queues:
  - name: mixed
    capacity: {h100: 4, a100: 8}
    fungibility: {when_can_borrow: try_next_type}
    instance_types: {h100: ml.p5.48xlarge, a100: ml.p4d.24xlarge}
    quotas:
      - {name: team-a, capacity: {h100: 2, a100: 4}, sharing: lend_and_borrow}
      - {name: team-b, capacity: {h100: 2, a100: 4}, sharing: lend_and_borrow}
  - name: lab
    capacity: 2
    quotas:
      - {name: team-lab, capacity: 2, sharing: reserve}
"""

TYPED_JOBS = (
    # team-a borrows one of team-b's h100s: within its 6 GPUs in all, above its 2 h100s
    {"case": "team_a_on_h100", "quota": "team-a", "gpus": 3, "state": "running", "gpu_type": "h100",
     "devices": ["0", "1", "2"]},
    {"case": "team_b_on_a100", "quota": "team-b", "gpus": 2, "state": "running", "gpu_type": "a100",
     "devices": ["3", "4"]},
    {"case": "team_b_waits_for_h100", "quota": "team-b", "gpus": 2, "gpu_types": ["h100"]},
    {"case": "team_lab_running", "quota": "team-lab", "gpus": 1, "state": "running", "devices": ["5"]},
)
"""Seeded into :data:`TYPED_QUOTAS`' job queues (also by the CLI, REST and metrics tests)."""


@pytest.fixture
def session(tmp_path):
    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        seed_into(list(TYPED_JOBS), session=session)
        yield session


def test_a_typed_quota_has_each_types_figures_from_its_jobs_of_that_type(session):
    rows = {r.quota.name: r for r in quota_rows(parse_quota_file(yaml.safe_load(TYPED_QUOTAS)), session=session)}

    figures = {(name, t.gpu_type): t.usage for name, r in rows.items() for t in r.types}
    assert figures == {
        ("team-a", "h100"): QuotaUsage(capacity=2, in_use=3, borrowed=1, lent=0, free=1, pending_jobs=0, pending_gpus=0),
        ("team-a", "a100"): QuotaUsage(capacity=4, in_use=0, borrowed=0, lent=0, free=6, pending_jobs=0, pending_gpus=0),
        ("team-b", "h100"): QuotaUsage(capacity=2, in_use=0, borrowed=0, lent=1, free=1, pending_jobs=0, pending_gpus=0),
        ("team-b", "a100"): QuotaUsage(capacity=4, in_use=2, borrowed=0, lent=0, free=6, pending_jobs=0, pending_gpus=0),
    }
    assert [t.gpu_type for t in rows["team-a"].types] == ["h100", "a100"]  # the queue's order
    # the quota's own figures stay the sums the policy's queue-wide arithmetic gives
    assert rows["team-a"].usage == QuotaUsage(capacity=6, in_use=3, borrowed=0, lent=0, free=7, pending_jobs=0, pending_gpus=0)
    assert (rows["team-b"].usage.pending_jobs, rows["team-b"].usage.pending_gpus) == (1, 2)
    assert [idle(t.usage) for t in rows["team-b"].types] == [1, 2]


def test_an_untyped_queue_has_no_type_figures(session):
    rows = {r.quota.name: r for r in quota_rows(parse_quota_file(yaml.safe_load(TYPED_QUOTAS)), session=session)}
    assert rows["team-lab"].types == ()
    assert rows["team-lab"].usage == QuotaUsage(capacity=2, in_use=1, borrowed=0, lent=0, free=1, pending_jobs=0, pending_gpus=0)


def test_a_running_job_of_no_listed_type_counts_on_the_queues_first_type_as_the_policy_counts_it(session):
    # admitted before the file had types: no type of its own, no host of a type known here
    seed_into([{"case": "team_a_untyped_running", "quota": "team-a", "gpus": 1, "state": "running", "devices": ["6"]}],
              session=session)
    rows = {r.quota.name: r for r in quota_rows(parse_quota_file(yaml.safe_load(TYPED_QUOTAS)), session=session)}
    assert [(t.gpu_type, t.usage.in_use, t.usage.borrowed) for t in rows["team-a"].types] == [("h100", 4, 2), ("a100", 0, 0)]
    assert sum(t.usage.in_use for t in rows["team-a"].types) == rows["team-a"].usage.in_use == 4


def test_a_typed_cohort_has_its_subtrees_figures_per_gpu_type(session):
    data = yaml.safe_load(TYPED_QUOTAS)
    mixed = data["queues"][0]
    mixed["cohorts"] = [{"name": "ml", "capacity": {"a100": 2}}]
    mixed["capacity"]["a100"] = 10
    mixed["quotas"][0]["cohort"] = "ml"  # team-a; team-b stays at the root
    (ml,) = cohort_rows(parse_quota_file(data), session=session)
    assert [(t.gpu_type, t.usage) for t in ml.types] == [
        ("h100", CohortUsage(parent=None, capacity=2, in_use=3, borrowed=1, lent=0)),
        ("a100", CohortUsage(parent=None, capacity=6, in_use=0, borrowed=0, lent=0)),
    ]
    assert (ml.usage.capacity, ml.usage.in_use, ml.usage.borrowed) == (8, 3, 0)  # over both types: within its 8
