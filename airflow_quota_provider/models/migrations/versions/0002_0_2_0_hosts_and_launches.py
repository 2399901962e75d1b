"""Hosts and launches for the GPU fleet: jobs name their host and launch handle, devices are keyed
(host, index), and the audit log says on which host.

``quota_job.pid`` and ``quota_job.job_dir`` go: the executor now knows only the launcher's opaque
handle. Device allocations are transient (freed when a job's process ends), so the table is made
anew; upgrade with no job running.

Revision ID: 0002_quota_hosts
Revises: 0001_quota
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_quota_hosts"
down_revision = "0001_quota"
branch_labels = None
depends_on = None


def upgrade():
    with op.batch_alter_table("quota_job") as batch:
        batch.add_column(sa.Column("host", sa.String(255)))
        batch.add_column(sa.Column("handle", sa.String(255)))
        batch.drop_column("pid")
        batch.drop_column("job_dir")
    with op.batch_alter_table("quota_event") as batch:
        batch.add_column(sa.Column("host", sa.String(255)))
    op.drop_table("quota_device_allocation")
    op.create_table(
        "quota_device_allocation",
        sa.Column("host", sa.String(255), primary_key=True),
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("quota_job.id", ondelete="CASCADE"), nullable=False),
        sa.Column("allocated_at", sa.Float(), nullable=False),
    )
    op.create_table(
        "quota_host",
        sa.Column("name", sa.String(255), primary_key=True),
        sa.Column("queues", sa.Text(), nullable=False),
        sa.Column("devices", sa.Text(), nullable=False),
        sa.Column("celery_name", sa.String(255)),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("registered_at", sa.Float(), nullable=False),
        sa.Column("heartbeat_at", sa.Float(), nullable=False),
        sa.Column("lost_at", sa.Float()),
    )
    op.create_table(
        "quota_launch",
        sa.Column("handle", sa.String(255), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("quota_job.id", ondelete="CASCADE"), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("state", sa.String(20), nullable=False),
        sa.Column("rc", sa.Integer()),
        sa.Column("worker_pid", sa.Integer()),
        sa.Column("sent_at", sa.Float(), nullable=False),
        sa.Column("started_at", sa.Float()),
        sa.Column("ended_at", sa.Float()),
    )


def downgrade():
    op.drop_table("quota_launch")
    op.drop_table("quota_host")
    op.drop_table("quota_device_allocation")
    op.create_table(
        "quota_device_allocation",
        sa.Column("device", sa.String(64), primary_key=True),
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("quota_job.id", ondelete="CASCADE"), nullable=False),
        sa.Column("allocated_at", sa.Float(), nullable=False),
    )
    with op.batch_alter_table("quota_event") as batch:
        batch.drop_column("host")
    with op.batch_alter_table("quota_job") as batch:
        batch.drop_column("handle")
        batch.drop_column("host")
        batch.add_column(sa.Column("pid", sa.Integer()))
        batch.add_column(sa.Column("job_dir", sa.Text()))
