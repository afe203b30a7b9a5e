"""retention: jobs.expired_at, the blobs table (leases and sizes), blob lookup indexes

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_SHA_INDEXES = (
    ("ix_jobs_model_sha256", "jobs", "model_sha256"),
    ("ix_jobs_inputs_sha256", "jobs", "inputs_sha256"),
    ("ix_jobs_weights_sha256", "jobs", "weights_sha256"),
    ("ix_artifacts_sha256", "artifacts", "sha256"),
)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True))
    op.create_table(
        "blobs",
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=True),
        sa.Column("leased_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256"),
    )
    for name, table, column in _SHA_INDEXES:
        op.create_index(name, table, [column], unique=False)
    # Every blob the jobs already refer to gets its row (leased now), so the collector
    # can let it go once those jobs expire. Artifact sizes are known; upload sizes were
    # never recorded (null: they count 0 towards a key's quota).
    op.execute(
        """
        INSERT INTO blobs (sha256, size, leased_at)
        SELECT sha256, MAX(size), CURRENT_TIMESTAMP FROM (
            SELECT sha256, size FROM artifacts
            UNION ALL SELECT model_sha256, NULL FROM jobs
            UNION ALL SELECT inputs_sha256, NULL FROM jobs WHERE inputs_sha256 IS NOT NULL
            UNION ALL SELECT weights_sha256, NULL FROM jobs WHERE weights_sha256 IS NOT NULL
        ) AS referenced
        GROUP BY sha256
        """
    )


def downgrade() -> None:
    for name, table, _ in reversed(_SHA_INDEXES):
        op.drop_index(name, table_name=table)
    op.drop_table("blobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("expired_at")
