"""metrics: worker processes, totals of finished jobs, the queued-jobs index

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_processes",
        sa.Column("id", sa.String(length=255), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("queues", sa.String(length=255), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "metric_totals",
        sa.Column("family", sa.String(length=64), nullable=False),
        sa.Column("sample", sa.String(length=16), nullable=False),
        sa.Column("labels", sa.String(length=255), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("family", "sample", "labels"),
    )
    op.create_index(
        "ix_jobs_status_queue_created", "jobs", ["status", "queue", "created_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_status_queue_created", table_name="jobs")
    op.drop_table("metric_totals")
    op.drop_table("worker_processes")
