"""The provider's Alembic migrations create exactly the ORM's tables and downgrade to nothing, keeping
what a downgrade can keep."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration_support import provider_shim

SCRIPT = r"""
import json
from sqlalchemy import inspect
from airflow import settings
from airflow.utils.session import create_session
from airflow_quota_provider.models.db import QuotaDBManager

out = {}
with create_session() as session:
    manager = QuotaDBManager(session)
    manager.upgradedb(use_migration_files=True)
    insp = inspect(settings.engine)
    out["after_upgrade"] = {t: sorted(c["name"] for c in insp.get_columns(t)) for t in QuotaDBManager.metadata.tables if insp.has_table(t)}
    out["orm"] = {t.name: sorted(c.name for c in t.columns) for t in QuotaDBManager.metadata.tables.values()}
    out["revision"] = manager.get_current_revision()
    out["check"] = manager.check_migration()
with create_session() as session:
    QuotaDBManager(session).downgrade("base")
insp = inspect(settings.engine)
out["after_downgrade"] = [t for t in QuotaDBManager.metadata.tables if insp.has_table(t)]
print(json.dumps(out))
"""


def test_migrations_match_the_orm_and_downgrade(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path}/migrate.db",
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PYTHONPATH=os.pathsep.join([str(provider_shim(tmp_path / "site")), str(Path(__file__).parents[2])]),
    )
    result = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["after_upgrade"] == out["orm"]
    assert out["revision"] == "0012_usage_per_gpu_type" and out["check"] is True
    assert out["after_downgrade"] == []


DOWNGRADE_TYPES = r"""
import json
from sqlalchemy import text
from airflow.utils.session import create_session
from airflow_quota_provider.models.db import QuotaDBManager

with create_session() as session:
    QuotaDBManager(session).upgradedb(use_migration_files=True)
rows = [  # day 0: team-a's untyped row (before its file gained types) and two typed; team-b typed only
    (0, "quota", "q", "team-a", "", "", 10, 1), (0, "quota", "q", "team-a", "", "h100", 20, 2),
    (0, "quota", "q", "team-a", "", "a100", 30, 3), (0, "quota", "q", "team-b", "", "h100", 40, 4),
    (0, "pool", "q", "", "", "", 50, 5),
]
with create_session() as session:
    for day, scope, queue, quota, dag_id, gpu_type, capacity, used in rows:
        session.execute(text(
            "INSERT INTO quota_usage_daily (day, scope, queue, quota, dag_id, gpu_type, capacity_s, used_within,"
            " borrowed, lent, idle, lost, drawn) VALUES (:day, :scope, :queue, :quota, :dag_id, :gpu_type, :capacity,"
            " :used, 0, 0, 0, 0, 0)"), dict(day=day, scope=scope, queue=queue, quota=quota, dag_id=dag_id,
                                             gpu_type=gpu_type, capacity=capacity, used=used))
with create_session() as session:
    QuotaDBManager(session).downgrade("0011_gpu_types")
with create_session() as session:
    got = session.execute(text("SELECT scope, quota, capacity_s, used_within FROM quota_usage_daily"
                               " ORDER BY scope, quota")).all()
print(json.dumps([list(r) for r in got]))
"""


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_downgrading_usage_per_gpu_type_sums_each_quotas_rows_of_a_day_into_one(tmp_path, backend):
    """The roll-up before types had one row per quota and day: the downgrade adds up its types' rows
    and the untyped row of the same day, which a day on which the quota file gained types has too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW__")}
    database = None
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path}/migrate.db"
    else:
        from tests.fleet_support import PG, _admin

        database = f"quota_migrate_{secrets.token_hex(4)}"
        _admin(f"CREATE DATABASE {database}")
        url = f"{PG.replace('postgresql://', 'postgresql+psycopg2://')}/{database}"
    env.update(
        AIRFLOW_HOME=str(tmp_path),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=url,
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        PYTHONPATH=os.pathsep.join([str(provider_shim(tmp_path / "site")), str(Path(__file__).parents[2])]),
    )
    try:
        result = subprocess.run([sys.executable, "-c", DOWNGRADE_TYPES], env=env, capture_output=True, text=True,
                                timeout=180)
    finally:
        if database is not None:
            _admin(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        ["pool", "", 50.0, 5.0], ["quota", "team-a", 60.0, 6.0], ["quota", "team-b", 40.0, 4.0]]
