"""The jobs list (`GET /v1/exports`): one page of summaries, and the cursor of the next.

A summary is a few hundred bytes whatever its job recorded: the page reads neither stage
events nor artifacts, and of a stored error only its code, extracted by the database (a
job's events and error can hold ~500 KiB; a page of 100 whole jobs was 40 MiB, read and
serialized on every call, and slowed every other tenant's requests).
"""

from __future__ import annotations

import base64
import binascii
import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, cast, func, select
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Session

from persistence.models import Job
from schemas import ErrorSummary, JobSummary
from service.auth import Caller
from service.errors import InvalidRequest
from service.jobs import owner_filter

SUMMARY_COLUMNS = (
    Job.id,
    Job.status,
    Job.stage,
    Job.cache_hit,
    Job.created_at,
    Job.started_at,
    Job.finished_at,
    Job.attempts,
    Job.model_name,
    Job.inputs_name,
    Job.weights_name,
    Job.calibration_name,
    Job.expired_at,
)
"""The columns of `JobSummary` as they are stored (its `error` is read by `_error_code`, its
`targets` by `_targets`)."""


def _error_code(dialect: str) -> ColumnElement[Any]:
    """The `code` of a job's stored error (JSON), extracted by the database."""
    if dialect == "postgresql":
        return cast(Job.error_json, JSONB)["code"].astext
    return func.json_extract(Job.error_json, "$.code")


def _targets(dialect: str) -> ColumnElement[Any]:
    """The `targets` of a job's stored options, as JSON text, extracted by the database."""
    if dialect == "postgresql":
        return cast(Job.options_json, JSONB)["targets"].astext
    return func.json_extract(Job.options_json, "$.targets")


def _target_names(text: str | None) -> list[str]:
    names = json.loads(text) if text else []
    return [str(name) for name in names] if isinstance(names, list) else []


def encode_cursor(created_at: datetime, job_id: str) -> str:
    """The cursor of the page after the job (`created_at`, `job_id`)."""
    raw = f"{created_at.isoformat()}|{job_id}".encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    """The position a cursor of `encode_cursor` names.

    Raises:
        InvalidRequest: not such a cursor: undecodable, a time without its zone or outside
            `datetime`'s range once in UTC (year 1 at +14:00), a job id with a NUL byte.
    """
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_text, job_id = raw.split("|", 1)
        created = datetime.fromisoformat(created_text)
        if created.tzinfo is None or "\x00" in job_id:
            raise ValueError("not a cursor of this API")
        return created.astimezone(UTC), job_id
    except (ValueError, OverflowError, UnicodeDecodeError, binascii.Error) as exc:
        raise InvalidRequest(
            "invalid cursor",
            hint="pass the `next_cursor` of the previous page as it was, or no cursor for the "
            "first page",
            details={"field": "cursor"},
        ) from exc


def list_jobs(
    session: Session,
    caller: Caller,
    *,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[JobSummary], str | None]:
    """The caller's jobs as summaries, newest first; returns one page and the cursor of
    the next (None on the last page)."""
    dialect = session.get_bind().dialect.name
    query = select(
        *SUMMARY_COLUMNS,
        _error_code(dialect).label("error_code"),
        _targets(dialect).label("targets"),
    ).where(owner_filter(caller))
    if status is not None:
        query = query.where(Job.status == status)
    if cursor is not None:
        created, job_id = decode_cursor(cursor)
        query = query.where(
            (Job.created_at < created) | ((Job.created_at == created) & (Job.id < job_id))
        )
    query = query.order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    summaries = []
    for row in session.execute(query):
        fields = dict(row._mapping)
        code = fields.pop("error_code")
        fields["targets"] = _target_names(fields.pop("targets"))
        summaries.append(
            JobSummary(**fields, error=ErrorSummary(code=code) if code is not None else None)
        )
    if len(summaries) <= limit:
        return summaries, None
    last = summaries[limit - 1]
    return summaries[:limit], encode_cursor(last.created_at, last.id)
