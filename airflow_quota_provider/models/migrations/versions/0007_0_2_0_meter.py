"""Metrics cursors shared by the schedulers (:mod:`airflow_quota_provider.models.meter`): each
scheduler counted every event and GPU-second itself, so two schedulers counted them twice.

Revision ID: 0007_quota_meter
Revises: 0006_quota_estimated_start
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_quota_meter"
down_revision = "0006_quota_estimated_start"
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "quota_meter",
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("position", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="quota_meter_pkey"),
    )


def downgrade():
    op.drop_table("quota_meter")
