"""The DB manager that ``airflow db migrate`` runs for the provider's tables (``db-managers`` entry)."""

from __future__ import annotations

import os

from airflow.utils.db_manager import BaseDBManager

from airflow_quota_provider.models import host as _host, job as _job, meter as _meter, usage as _usage  # noqa: F401  (registers the tables)
from airflow_quota_provider.models.base import quota_metadata

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))

_REVISION_HEADS_MAP: dict[str, str] = {
    "0.1.0": "0001_quota",
    "0.2.0": "0012_usage_per_gpu_type",
}
"""Provider release -> Alembic head at that release."""


class QuotaDBManager(BaseDBManager):
    """Creates and migrates ``quota_job``, ``quota_device_allocation``, ``quota_event``,
    ``quota_preemption_count``, ``quota_host``, ``quota_launch``, ``quota_usage_daily`` and ``quota_meter``; its Alembic version lives in
    ``alembic_version_quota``."""

    metadata = quota_metadata
    version_table_name = "alembic_version_quota"
    migration_dir = os.path.join(PACKAGE_DIR, "migrations")
    alembic_file = os.path.join(PACKAGE_DIR, "alembic.ini")
    supports_table_dropping = True
    revision_heads_map = _REVISION_HEADS_MAP

    def downgrade(self, to_revision, from_revision=None, show_sql_only=False):
        """Downgrade the provider's tables to ``to_revision`` (an Alembic revision or ``base``)."""
        from alembic import command

        config = self.get_alembic_config()
        if show_sql_only:
            if not from_revision:
                from_revision = self.get_current_revision()
            command.downgrade(config, revision=f"{from_revision}:{to_revision}", sql=True)
        else:
            command.downgrade(config, revision=to_revision)
