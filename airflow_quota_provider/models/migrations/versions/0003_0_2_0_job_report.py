"""Two schedulers: what a job's end means for the scheduler that queued its task.

Either scheduler may settle any job, but only the one that queued the task (Airflow's
``task_instance.queued_by_job_id``) may report it to Airflow; ``quota_job.report`` carries the
outcome until that scheduler's executor has reported it.

Revision ID: 0003_quota_report
Revises: 0002_quota_hosts
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_quota_report"
down_revision = "0002_quota_hosts"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.add_column(sa.Column("report", sa.String(20)))
        batch.create_index("idx_quota_job_report", ["report"])


def downgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.drop_index("idx_quota_job_report")
        batch.drop_column("report")
