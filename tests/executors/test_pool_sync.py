"""Two schedulers starting at the same moment both make the quotas' Airflow pools: the second waits
for the first instead of dying on the pool's unique name (real PostgreSQL, two sessions)."""

from __future__ import annotations

import secrets
import threading

import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from airflow.models.pool import Pool
from tests.fleet_support import _admin

QUOTAS = "queues:\n  - name: q\n    capacity: 4\n    quotas:\n      - {name: team-a, capacity: 2}\n      - {name: team-b, capacity: 2}\n"


@pytest.fixture
def engine():
    database = f"quota_pools_{secrets.token_hex(4)}"
    _admin(f"CREATE DATABASE {database}")
    engine = create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}")
    from airflow.models import import_all_models
    from airflow.models.team import Team

    import_all_models()
    Pool.metadata.create_all(engine, tables=[Team.__table__, Pool.__table__])
    yield engine
    engine.dispose()
    _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_two_schedulers_making_the_pools_at_once_both_start(engine, executor_for):
    first, second = executor_for(QUOTAS), executor_for(QUOTAS)
    errors: list[BaseException] = []
    with Session(engine) as one, Session(engine) as other:
        first._sync_pools(one)  # inserted, not committed yet

        def start_second() -> None:
            try:
                second._sync_pools(other)
                other.commit()
            except BaseException as e:  # noqa: BLE001 - reported by the assertion below
                errors.append(e)

        thread = threading.Thread(target=start_second)
        thread.start()
        thread.join(1.0)
        assert thread.is_alive(), "the second scheduler waits for the first one's pools"
        one.commit()
        thread.join(30)
    assert errors == []
    with Session(engine) as s:
        assert sorted(s.scalars(select(Pool.pool))) == ["team-a", "team-b"]
