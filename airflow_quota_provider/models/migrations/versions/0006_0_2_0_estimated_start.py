"""Estimated start times: when each waiting job is expected to start, forecast off the scheduler's
critical path (:mod:`airflow_quota_provider.executors.estimates`).

Revision ID: 0006_quota_estimated_start
Revises: 0005_quota_usage
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_quota_estimated_start"
down_revision = "0005_quota_usage"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.add_column(sa.Column("estimated_start_at", sa.Float()))


def downgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.drop_column("estimated_start_at")
