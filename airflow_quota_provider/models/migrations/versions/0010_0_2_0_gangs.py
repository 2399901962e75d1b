"""Jobs on several hosts (gangs, issue 32): a job's node count and where each node runs; which node
a launch starts and the port its node 0 chose; the address a host's peers reach it at.

Revision ID: 0010_gangs
Revises: 0009_quota_event_detail
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010_gangs"
down_revision = "0009_quota_event_detail"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.add_column(sa.Column("nodes", sa.Integer(), nullable=False, server_default="1"))
        batch.add_column(sa.Column("gang", sa.Text()))
    with op.batch_alter_table("quota_launch") as batch:
        batch.add_column(sa.Column("node_rank", sa.Integer(), nullable=False, server_default="0"))
        batch.add_column(sa.Column("port", sa.Integer()))
    with op.batch_alter_table("quota_host") as batch:
        batch.add_column(sa.Column("address", sa.String(255)))


def downgrade():
    with op.batch_alter_table("quota_host") as batch:
        batch.drop_column("address")
    with op.batch_alter_table("quota_launch") as batch:
        batch.drop_column("port")
        batch.drop_column("node_rank")
    with op.batch_alter_table("quota_job") as batch:
        batch.drop_column("gang")
        batch.drop_column("nodes")
