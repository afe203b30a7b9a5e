"""zip members: where each regular file of an uploaded model zip lies in its blob

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-28 09:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Zips stored before this table are indexed at the first read of one of their files.
    op.create_table(
        "zip_members",
        sa.Column("blob_sha256", sa.String(length=64), nullable=False),
        sa.Column("path_sha256", sa.String(length=64), nullable=False),
        sa.Column("header_offset", sa.BigInteger(), nullable=False),
        sa.Column("compress_size", sa.BigInteger(), nullable=False),
        sa.Column("file_size", sa.BigInteger(), nullable=False),
        sa.Column("compress_type", sa.Integer(), nullable=False),
        sa.Column("flag_bits", sa.Integer(), nullable=False),
        sa.Column("crc", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(["blob_sha256"], ["blobs.sha256"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("blob_sha256", "path_sha256"),
    )


def downgrade() -> None:
    op.drop_table("zip_members")
