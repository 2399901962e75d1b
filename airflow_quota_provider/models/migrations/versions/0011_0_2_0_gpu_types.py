"""GPU types (issue 33): the type of a host's GPUs, the types a job accepts and the one it runs on.

Revision ID: 0011_gpu_types
Revises: 0010_gangs
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011_gpu_types"
down_revision = "0010_gangs"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_host") as batch:
        batch.add_column(sa.Column("gpu_type", sa.String(64)))
    with op.batch_alter_table("quota_job") as batch:
        batch.add_column(sa.Column("gpu_types", sa.Text()))
        batch.add_column(sa.Column("gpu_type", sa.String(64)))


def downgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.drop_column("gpu_type")
        batch.drop_column("gpu_types")
    with op.batch_alter_table("quota_host") as batch:
        batch.drop_column("gpu_type")
