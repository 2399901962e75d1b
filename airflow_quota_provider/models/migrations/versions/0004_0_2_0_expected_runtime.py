"""Expected runtimes: how long a job's run is expected to take, for the victim search and estimates.

Revision ID: 0004_quota_expected_runtime
Revises: 0003_quota_report
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_quota_expected_runtime"
down_revision = "0003_quota_report"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.add_column(sa.Column("expected_runtime_s", sa.Float()))


def downgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.drop_column("expected_runtime_s")
