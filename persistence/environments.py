"""The environments workers describe when they start, kept in the database for the API.

The API never imports torch, and in production it runs in another container than the
workers: each worker describes its own environment (`engine.environment.libraries`) at start and
records it here, keyed by queue and host; `GET /v1/environment` answers each queue's most
recent.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from persistence.database import transaction, upsert
from persistence.models import WorkerEnvironmentRow, utcnow
from schemas import EnvironmentDescription, EnvironmentList, WorkerEnvironment


def record_environment(
    sessions: sessionmaker[Session],
    *,
    queue: str,
    hostname: str,
    environment: EnvironmentDescription,
    at: datetime | None = None,
) -> None:
    """Store (or replace) what the worker on `hostname` serving `queue` runs with."""
    values = {
        "queue": queue,
        "hostname": hostname[:255],
        "recorded_at": at or utcnow(),
        "environment_json": environment.model_dump_json(),
    }
    with transaction(sessions) as session:
        # An upsert (both databases torchport runs on have one), so that two workers of
        # one host starting together cannot collide.
        statement = upsert(session, WorkerEnvironmentRow).values(**values)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["queue", "hostname"],
                set_={
                    "recorded_at": statement.excluded.recorded_at,
                    "environment_json": statement.excluded.environment_json,
                },
            )
        )


def latest_environments(session: Session) -> EnvironmentList:
    """For each queue, the environment its most recently started worker recorded."""
    rows = session.scalars(
        select(WorkerEnvironmentRow).order_by(
            WorkerEnvironmentRow.queue,
            WorkerEnvironmentRow.recorded_at.desc(),
            WorkerEnvironmentRow.hostname,
        )
    )
    latest: dict[str, WorkerEnvironment] = {}
    for row in rows:
        if row.queue in latest:
            continue
        latest[row.queue] = WorkerEnvironment(
            queue=row.queue,
            hostname=row.hostname,
            recorded_at=row.recorded_at,
            environment=EnvironmentDescription.model_validate_json(row.environment_json),
        )
    return EnvironmentList(workers=list(latest.values()))
