"""the callback URL is the job's, not the export options'

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-25 07:00:00
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_jobs = sa.table(
    "jobs",
    sa.column("id", sa.String),
    sa.column("options_json", sa.Text),
    sa.column("callback_url", sa.String),
)


def upgrade() -> None:
    op.add_column("jobs", sa.Column("callback_url", sa.String(length=2048), nullable=True))
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(_jobs.c.id, _jobs.c.options_json).where(
            _jobs.c.options_json.like('%"callback_url"%')
        )
    )
    for job_id, options_json in rows.all():
        options = json.loads(options_json)
        url = options.pop("callback_url", None)
        connection.execute(
            sa.update(_jobs)
            .where(_jobs.c.id == job_id)
            .values(options_json=json.dumps(options), callback_url=url)
        )


def downgrade() -> None:
    connection = op.get_bind()
    rows = connection.execute(
        sa.select(_jobs.c.id, _jobs.c.options_json, _jobs.c.callback_url).where(
            _jobs.c.callback_url.is_not(None)
        )
    )
    for job_id, options_json, url in rows.all():
        options = {**json.loads(options_json), "callback_url": url}
        connection.execute(
            sa.update(_jobs).where(_jobs.c.id == job_id).values(options_json=json.dumps(options))
        )
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("callback_url")
