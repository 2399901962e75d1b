"""The quotas in force, on each ``config_loaded`` event: usage accounting charges every past moment
with the capacities of the quota file loaded then, and idle capacity only from when a quota appeared
(it charged all history with today's file, idle from the epoch).

Revision ID: 0009_quota_event_detail
Revises: 0008_quota_event_checkpoint
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_quota_event_detail"
down_revision = "0008_quota_event_checkpoint"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_event") as batch:
        batch.add_column(sa.Column("detail", sa.Text()))


def downgrade():
    with op.batch_alter_table("quota_event") as batch:
        batch.drop_column("detail")
