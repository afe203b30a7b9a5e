"""worker environments

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_environments",
        sa.Column("queue", sa.String(length=16), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("environment_json", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("queue", "hostname"),
    )
    op.create_index(
        "ix_worker_environments_recorded",
        "worker_environments",
        ["queue", "recorded_at"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index("ix_worker_environments_recorded", table_name="worker_environments")
    op.drop_table("worker_environments")
