"""Usage per GPU type (issue 33): the GPU type on each audit event of a job that ran on one, and the
daily roll-up's figures per quota and type (the type in its primary key, empty where untyped).

Revision ID: 0012_usage_per_gpu_type
Revises: 0011_gpu_types
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_usage_per_gpu_type"
down_revision = "0011_gpu_types"
branch_labels = None
depends_on = None

_KEY = ["day", "scope", "queue", "quota", "dag_id"]
_FIGURES = ["capacity_s", "used_within", "borrowed", "lent", "idle", "lost", "drawn"]


def upgrade():
    with op.batch_alter_table("quota_event") as batch:
        batch.add_column(sa.Column("gpu_type", sa.String(64)))
    with op.batch_alter_table("quota_usage_daily", recreate="always") as batch:
        batch.add_column(sa.Column("gpu_type", sa.String(64), nullable=False, server_default=""))
        batch.drop_constraint("quota_usage_daily_pkey", type_="primary")
        batch.create_primary_key("quota_usage_daily_pkey", [*_KEY, "gpu_type"])


def downgrade():
    # A quota's rows of one day become one row, their sums, as the roll-up had before types: all the
    # rows of that key, the untyped one too (a day on which its quota file gained types has both).
    key = ", ".join(_KEY)
    sums = ", ".join(f"SUM({f}) AS {f}" for f in _FIGURES)
    op.execute(f"CREATE TABLE quota_usage_daily_sums AS SELECT {key}, {sums} FROM quota_usage_daily GROUP BY {key}")
    op.execute("DELETE FROM quota_usage_daily")
    figures = ", ".join(_FIGURES)
    op.execute(f"INSERT INTO quota_usage_daily ({key}, gpu_type, {figures})"
               f" SELECT {key}, '', {figures} FROM quota_usage_daily_sums")
    op.execute("DROP TABLE quota_usage_daily_sums")
    with op.batch_alter_table("quota_usage_daily", recreate="always") as batch:
        batch.drop_constraint("quota_usage_daily_pkey", type_="primary")
        batch.create_primary_key("quota_usage_daily_pkey", _KEY)
        batch.drop_column("gpu_type")
    with op.batch_alter_table("quota_event") as batch:
        batch.drop_column("gpu_type")
