"""Create the quota tables: jobs, device allocations, audit events, preemption counts.

Revision ID: 0001_quota
Revises:
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_quota"
down_revision = None
branch_labels = None
depends_on = None


def upgrade():
    op.create_table(
        "quota_job",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("dag_id", sa.String(250), nullable=False),
        sa.Column("run_id", sa.String(250), nullable=False),
        sa.Column("task_id", sa.String(250), nullable=False),
        sa.Column("map_index", sa.Integer(), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("ti_id", sa.String(36)),
        sa.Column("quota", sa.String(128), nullable=False),
        sa.Column("queue_name", sa.String(128)),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("preemptible", sa.Boolean(), nullable=False),
        sa.Column("max_preemptions", sa.Integer()),
        sa.Column("grace_period_s", sa.Float()),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("submitted_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("finished_at", sa.Float()),
        sa.Column("pending_reason", sa.Text()),
        sa.Column("pending_position", sa.Integer()),
        sa.Column("pid", sa.Integer()),
        sa.Column("job_dir", sa.Text()),
        sa.Column("preempted_for", sa.String(64)),
        sa.Column("preempt_reason", sa.String(32)),
        sa.Column("preempt_deadline", sa.Float()),
        sa.Column("preempt_fail_message", sa.Text()),
        sa.Column("forced_at", sa.Float()),
        sa.Column("workload", sa.Text()),
        sa.Column("message", sa.Text()),
        sa.UniqueConstraint("dag_id", "run_id", "task_id", "map_index", "try_number", name="quota_job_ti_uq"),
    )
    op.create_table(
        "quota_device_allocation",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("quota_job.id", ondelete="CASCADE"), nullable=False),
        sa.Column("allocated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "quota_event",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=True),
        sa.Column("at", sa.Float(), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("job_id", sa.Integer()),
        sa.Column("dag_id", sa.String(250)),
        sa.Column("run_id", sa.String(250)),
        sa.Column("task_id", sa.String(250)),
        sa.Column("map_index", sa.Integer()),
        sa.Column("quota", sa.String(128)),
        sa.Column("victim", sa.String(64)),
        sa.Column("preemptor", sa.String(64)),
        sa.Column("reason", sa.String(64)),
        sa.Column("devices", sa.String(512)),
        sa.Column("message", sa.Text()),
    )
    op.create_table(
        "quota_preemption_count",
        sa.Column("dag_id", sa.String(250), primary_key=True),
        sa.Column("run_id", sa.String(250), primary_key=True),
        sa.Column("task_id", sa.String(250), primary_key=True),
        sa.Column("map_index", sa.Integer(), primary_key=True),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.Column("last_at", sa.Float()),
    )


def downgrade():
    op.drop_table("quota_preemption_count")
    op.drop_table("quota_event")
    op.drop_table("quota_device_allocation")
    op.drop_table("quota_job")
