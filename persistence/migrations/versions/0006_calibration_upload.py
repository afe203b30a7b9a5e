"""calibration upload: jobs.calibration_sha256 and jobs.calibration_name, and its blob index

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-27 07:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("calibration_sha256", sa.String(length=64), nullable=True))
    op.add_column("jobs", sa.Column("calibration_name", sa.String(length=255), nullable=True))
    op.create_index("ix_jobs_calibration_sha256", "jobs", ["calibration_sha256"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_jobs_calibration_sha256", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("calibration_name")
        batch.drop_column("calibration_sha256")
