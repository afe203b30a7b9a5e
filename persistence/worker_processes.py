"""Which export worker processes are alive, and which of them are busy, for `/metrics`.

A job's heartbeat says only that its worker is alive while it runs a job; an idle worker
would be invisible. So each export worker process also records itself (`beat`, every
heartbeat interval, from a thread of its own) and deletes its row when it stops
(`forget`); one killed leaves a row that stops being seen and is pruned later. A process
is busy while a running job names it as its `worker`.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from persistence.database import transaction, upsert
from persistence.models import Job, WorkerProcess, utcnow


def beat(sessions: sessionmaker[Session], identity: str, hostname: str, queues: list[str]) -> None:
    """Record that the process `identity`, consuming `queues`, is alive now."""
    now = utcnow()
    values = {
        "id": identity[:255],
        "hostname": hostname[:255],
        "queues": ",".join(queues)[:255],
        "started_at": now,
        "seen_at": now,
    }
    with transaction(sessions) as session:
        statement = upsert(session, WorkerProcess).values(**values)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=["id"], set_={"seen_at": statement.excluded.seen_at}
            )
        )


def forget(sessions: sessionmaker[Session], identity: str) -> None:
    """Delete the row of a process that stops."""
    with transaction(sessions) as session:
        session.execute(delete(WorkerProcess).where(WorkerProcess.id == identity[:255]))


def prune(sessions: sessionmaker[Session], before: datetime) -> int:
    """Delete the rows of processes not seen since `before` (killed without a goodbye);
    returns how many."""
    with transaction(sessions) as session:
        result = session.execute(delete(WorkerProcess).where(WorkerProcess.seen_at < before))
        return int(result.rowcount)  # type: ignore[attr-defined]


def by_queue(session: Session, seen_since: datetime) -> dict[str, dict[str, int]]:
    """Per queue, the processes seen since `seen_since` that are `busy` (a running job
    names them) and `idle`; a process consuming several queues counts in each. Two
    bounded queries: the live rows, and the workers of running jobs (`ix_jobs_status`)."""
    live = session.execute(
        select(WorkerProcess.id, WorkerProcess.queues).where(WorkerProcess.seen_at >= seen_since)
    ).all()
    running = set(
        session.scalars(select(Job.worker).where(Job.status == "running").distinct()).all()
    )
    counts: dict[str, dict[str, int]] = defaultdict(lambda: {"busy": 0, "idle": 0})
    for identity, queues in live:
        state = "busy" if identity in running else "idle"
        for queue in filter(None, queues.split(",")):
            counts[queue][state] += 1
    return dict(counts)
