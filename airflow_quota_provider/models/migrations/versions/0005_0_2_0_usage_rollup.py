"""Usage accounting: the daily roll-up that keeps chargeback totals once ``airflow quota db-clean``
prunes the audit log, and an index on ``quota_event.at`` for reports and pruning by time.

Revision ID: 0005_quota_usage
Revises: 0004_quota_expected_runtime
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_quota_usage"
down_revision = "0004_quota_expected_runtime"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "quota_usage_daily",
        sa.Column("day", sa.Float(), nullable=False),
        sa.Column("scope", sa.String(8), nullable=False),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("quota", sa.String(128), nullable=False),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("capacity_s", sa.Float(), nullable=False),
        sa.Column("used_within", sa.Float(), nullable=False),
        sa.Column("borrowed", sa.Float(), nullable=False),
        sa.Column("lent", sa.Float(), nullable=False),
        sa.Column("idle", sa.Float(), nullable=False),
        sa.Column("lost", sa.Float(), nullable=False),
        sa.Column("drawn", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("day", "scope", "queue", "quota", "dag_id", name="quota_usage_daily_pkey"),
    )
    with op.batch_alter_table("quota_event") as batch:
        batch.create_index("idx_quota_event_at", ["at"])


def downgrade():
    with op.batch_alter_table("quota_event") as batch:
        batch.drop_index("idx_quota_event_at")
    op.drop_table("quota_usage_daily")
