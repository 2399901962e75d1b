"""One decider at a time per job queue, on a real PostgreSQL (``scripts/test`` starts it): two
sessions stand for two schedulers' cycles."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from airflow_quota_provider.models.coordination import db_now, lock_id, try_lock
from tests.faults.test_faults import skewed
from tests.fleet_support import _admin


@pytest.fixture(scope="module")
def engine():
    database = f"quota_locks_{secrets.token_hex(4)}"
    _admin(f"CREATE DATABASE {database}")
    engine = create_engine(f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}")
    yield engine
    engine.dispose()
    _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_a_queue_locked_by_one_cycle_is_skipped_by_the_other_until_it_commits(engine):
    with Session(engine) as first, Session(engine) as second:
        assert try_lock(["gpu-a", "gpu-b"], session=first) == {"gpu-a", "gpu-b"}
        assert try_lock(["gpu-a", "gpu-b", "gpu-c"], session=second) == {"gpu-c"}
        first.commit()  # the locks go with the transaction
        assert try_lock(["gpu-a", "gpu-b"], session=second) == {"gpu-a", "gpu-b"}
        assert try_lock(["gpu-a"], session=first) == set()
        second.rollback()
        assert try_lock(["gpu-a"], session=first) == {"gpu-a"}


def test_a_cycle_that_idles_past_the_timeout_loses_its_locks(engine):
    """A scheduler killed mid-cycle whose connection lives on (its forked log server shares the
    socket) must not hold its job queues for ever."""
    with Session(engine) as stalled, Session(engine) as other:
        assert try_lock(["gpu-a"], session=stalled, idle_timeout_s=0.5) == {"gpu-a"}
        assert try_lock(["gpu-a"], session=other) == set()
        other.rollback()
        time.sleep(1.5)
        assert try_lock(["gpu-a"], session=other) == {"gpu-a"}
        with pytest.raises(OperationalError):
            stalled.execute(text("SELECT 1"))


def test_lock_ids_are_stable_64_bit_and_distinct_per_name():
    ids = {lock_id(f"queue-{i}") for i in range(1000)}
    assert len(ids) == 1000 and all(-(2**63) <= i < 2**63 for i in ids)
    assert lock_id("gpu-fleet") == lock_id("gpu-fleet")


def test_off_postgresql_every_lock_is_granted():
    with Session(create_engine("sqlite://")) as session:
        assert try_lock(["a", "b"], session=session) == {"a", "b"}


def test_db_now_ignores_a_machine_clock_30s_ahead(engine):
    """The same reading from a process whose clock runs 30 s ahead."""
    script = (
        "import sys, time\n"
        "from sqlalchemy import create_engine\n"
        "from sqlalchemy.orm import Session\n"
        "from airflow_quota_provider.models.coordination import db_now\n"
        "with Session(create_engine(sys.argv[1])) as s:\n"
        "    print(time.time(), db_now(s))\n"
    )
    env = {**os.environ, **skewed({"PYTHONPATH": os.environ.get("PYTHONPATH", "")}, 30)}
    out = subprocess.run([sys.executable, "-c", script, str(engine.url.render_as_string(hide_password=False))],
                         env=env, capture_output=True, text=True, check=True, timeout=120).stdout.split()
    local, database = map(float, out)
    assert local - database > 25, "the process's own clock is ahead"
    with Session(engine) as session:
        assert abs(db_now(session) - database) < 10, "db_now is the database's time"
