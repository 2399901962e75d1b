"""REST service functions over a seeded SQLite database, without the api-server."""

from __future__ import annotations

import yaml
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from airflow_quota_provider.models.base import quota_metadata
from airflow_quota_provider.plugins import services
from airflow_quota_provider.policy import parse_quota_file
from tests.plugins.seed import seed_into
from tests.quota_api_support import BASELINE, QUOTAS


def test_cohorts_show_their_subtrees_and_quotas_name_their_cohort(tmp_path):
    data = yaml.safe_load(QUOTAS)
    fleet = data["queues"][0]
    fleet["capacity"] = 10
    fleet["cohorts"] = [{"name": "ml", "capacity": 2, "lend_limit": 1}]
    fleet["quotas"][0]["cohort"] = "ml"
    quota_file = parse_quota_file(data)
    engine = create_engine(f"sqlite:///{tmp_path / 'quota.db'}")
    quota_metadata.create_all(engine)
    with Session(engine) as session:
        seed_into(list(BASELINE), session=session)
        (ml,) = services.cohorts(quota_file, session=session).cohorts
        quotas = {q.name: q for q in services.quotas(quota_file, session=session).quotas}
        queue = next(q for q in services.queues(quota_file, session=session).queues if q.name == "gpu-fleet")
        (page, _) = services.dashboard(quota_file, "quotas.yaml", session=session).queues
    assert ml.model_dump() == {
        "name": "ml", "queue": "gpu-fleet", "parent": None, "capacity": 2, "subtree_capacity": 6, "in_use": 2,
        "borrowed": 0, "lent": 1, "borrow_limit": None, "lend_limit": 1,
    }
    assert (quotas["team-a"].cohort, quotas["team-b"].cohort) == ("ml", None)
    assert queue.common_pool == 0
    # the quota page draws team-a inside cohort ml's box, team-b in the queue's
    assert [(c.name, c.parent, c.capacity, c.in_use, c.lent) for c in page.cohorts] == [("ml", None, 6, 2, 1)]
    assert [(q.name, q.cohort) for q in page.quotas] == [("team-a", "ml"), ("team-b", None)]
