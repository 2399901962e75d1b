"""The last checkpoint of a preempted run, on its ``stopped`` event: usage accounting charges as lost
only the work since then (it counted from the run's start).

Revision ID: 0008_quota_event_checkpoint
Revises: 0007_quota_meter
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008_quota_event_checkpoint"
down_revision = "0007_quota_meter"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_event") as batch:
        batch.add_column(sa.Column("checkpoint_at", sa.Float()))


def downgrade():
    with op.batch_alter_table("quota_event") as batch:
        batch.drop_column("checkpoint_at")
