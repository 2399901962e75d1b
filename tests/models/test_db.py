"""The provider's Alembic migrations create exactly the ORM's tables and downgrade to nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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
