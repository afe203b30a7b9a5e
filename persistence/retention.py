"""Retention of stored blobs: leases, expiry, the collector, and what a key holds.

A finished job's uploads and artifacts are kept for the retention time after it finished;
then the collector (`collect`: `torchport gc`, and the API's periodic task) marks the job
expired (`jobs.expired_at`; the row and its status stay) and deletes every blob that no
unexpired job refers to. Blobs are content-addressed and shared (the same weights
uploaded twice, a cache hit's artifacts), so a blob goes only when its last job went.

Why a blob a job has just come to rely on is never deleted:

- Every writer *leases* the digests it is about to rely on (`lease`: a committed
  `blobs` row with `leased_at` = now) before it relies on the blob being there — the API
  before it puts a submission's uploads (`put_file` skips bytes already stored), the
  worker before it puts a job's artifacts, a cache hit before it commits a job holding
  the earlier job's artifacts (and then checks that job has not expired meanwhile).
- The collector deletes a blob only inside one transaction that first deletes its
  `blobs` row, on condition that the lease is older than `LEASE` and no unexpired job
  refers to it, and commits after the store let the blob go. A lease of the same digest
  waits for that row (PostgreSQL's row lock, SQLite's one writer) and then finds the
  blob gone and stores it again; a lease committed first keeps the blob. Jobs are
  marked expired in an earlier transaction, so a cache hit that leased after a deletion
  sees its source job expired and runs the job instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    delete,
    exists,
    func,
    not_,
    or_,
    select,
    union_all,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

from persistence.database import transaction
from persistence.models import Artifact, Blob, Job, utcnow
from persistence.store import ArtifactStore
from schemas.job import TERMINAL_STATUSES

LEASE = timedelta(hours=1)
"""How long a lease keeps a blob that no job refers to (yet): longer than any writer takes
from its lease to the commit of the job that refers to the blob (storing a 4 GiB upload
or a large artifact in S3 included)."""
BATCH = 500
"""Blobs examined per query of the collector."""


def lease(sessions: sessionmaker[Session], blobs: Mapping[str, int | None]) -> None:
    """Record, committed, that these blobs (digest → size) are about to be relied on.

    Call it before relying on a blob being stored (before `put_file`, which skips bytes
    already there, or before committing a job that refers to another job's blobs)."""
    if not blobs:
        return
    now = utcnow()
    with transaction(sessions) as session:
        dialect = session.get_bind().dialect.name
        insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
        rows = [{"sha256": sha, "size": blobs[sha], "leased_at": now} for sha in sorted(blobs)]
        statement = insert(Blob).values(rows)
        session.execute(
            statement.on_conflict_do_update(
                index_elements=[Blob.sha256],
                set_={
                    "leased_at": statement.excluded.leased_at,
                    "size": func.coalesce(statement.excluded.size, Blob.size),
                },
            )
        )


def _due(expire_before: datetime) -> ColumnElement[bool]:
    """Jobs whose files are due to go: finished before `expire_before`, not yet expired."""
    return and_(
        Job.expired_at.is_(None),
        Job.status.in_(TERMINAL_STATUSES),
        Job.finished_at < expire_before,
    )


def _referenced(expire_before: datetime | None) -> ColumnElement[bool]:
    """Whether a job that keeps its files refers to the blob of the row: any job not
    expired (queued and running ones too), less those due by `expire_before` when given
    (what a dry run counts as expired)."""
    sha = Blob.sha256
    live: ColumnElement[bool] = Job.expired_at.is_(None)
    if expire_before is not None:
        live = and_(live, not_(_due(expire_before)))
    return or_(
        exists().where(live, Job.model_sha256 == sha),
        exists().where(live, Job.inputs_sha256 == sha),
        exists().where(live, Job.weights_sha256 == sha),
        exists().where(live, Job.calibration_sha256 == sha),
        exists().where(Artifact.sha256 == sha, Artifact.job_id == Job.id, live),
    )


@dataclass
class Collection:
    """What one pass of the collector did (or, dry, would do)."""

    dry_run: bool
    expired_jobs: list[str] = field(default_factory=list)
    """Jobs marked expired in this pass."""
    deleted: dict[str, int | None] = field(default_factory=dict)
    """Blobs deleted from the store: digest → size (null when not recorded)."""

    @property
    def deleted_bytes(self) -> int:
        """Bytes of the deleted blobs whose size is known."""
        return sum(size or 0 for size in self.deleted.values())


def collect(
    sessions: sessionmaker[Session],
    store: ArtifactStore,
    *,
    retention: timedelta | None,
    now: datetime | None = None,
    lease_for: timedelta = LEASE,
    dry_run: bool = False,
) -> Collection:
    """Expire the jobs that finished more than `retention` ago (None: keep them forever)
    and delete the blobs no unexpired job refers to and nothing leased within `lease_for`.

    `dry_run` changes nothing and answers what a pass would do now. A deletion the
    store refuses rolls back its row (the next pass tries again) and raises StoreError.
    """
    now = now or utcnow()
    expire_before = None if retention is None else now - retention
    result = Collection(dry_run=dry_run)
    if expire_before is not None:
        with transaction(sessions) as session:
            if dry_run:
                found = session.scalars(select(Job.id).where(_due(expire_before)))
            else:
                found = session.scalars(
                    update(Job)
                    .where(_due(expire_before))
                    .values(expired_at=now)
                    .returning(Job.id)
                    .execution_options(synchronize_session=False)
                )
            result.expired_jobs = sorted(found)
    leased_before = now - lease_for
    # Dry, the jobs due now are not marked yet: count them as expired, as a pass would.
    counted_before = expire_before if dry_run else None
    after = ""
    while True:
        with sessions() as session:
            batch = session.execute(
                select(Blob.sha256, Blob.size)
                .where(
                    Blob.sha256 > after,
                    Blob.leased_at < leased_before,
                    not_(_referenced(counted_before)),
                )
                .order_by(Blob.sha256)
                .limit(BATCH)
            ).all()
        if not batch:
            return result
        after = batch[-1][0]
        for sha, size in batch:
            if dry_run:
                result.deleted[sha] = size
                continue
            with transaction(sessions) as session:
                gone = session.execute(
                    delete(Blob)
                    .where(
                        Blob.sha256 == sha,
                        Blob.leased_at < leased_before,
                        not_(_referenced(None)),
                    )
                    .returning(Blob.sha256)
                    .execution_options(synchronize_session=False)
                ).first()
                if gone is not None:  # still unreferenced, and no lease came first
                    store.delete(sha)
                    result.deleted[sha] = size


def _held_by(owner_id: str) -> Select[tuple[str]]:
    """The digests the key's unexpired jobs refer to (uploads and artifacts; repeats)."""
    live = and_(Job.owner_id == owner_id, Job.expired_at.is_(None))
    held = union_all(
        select(Job.model_sha256.label("sha256")).where(live),
        select(Job.inputs_sha256).where(live, Job.inputs_sha256.is_not(None)),
        select(Job.weights_sha256).where(live, Job.weights_sha256.is_not(None)),
        select(Job.calibration_sha256).where(live, Job.calibration_sha256.is_not(None)),
        select(Artifact.sha256).join(Job, Artifact.job_id == Job.id).where(live),
    ).subquery()
    return select(held.c.sha256)


def stored_bytes(session: Session, owner_id: str) -> int:
    """Bytes a key holds in the store: each distinct blob its unexpired jobs refer to,
    once (a cache hit's artifacts and re-uploaded weights are not counted twice)."""
    total = session.scalar(
        select(func.coalesce(func.sum(Blob.size), 0)).where(Blob.sha256.in_(_held_by(owner_id)))
    )
    return int(total or 0)


def held_digests(session: Session, owner_id: str, digests: set[str]) -> set[str]:
    """Which of `digests` the key's unexpired jobs already refer to."""
    if not digests:
        return set()
    held = _held_by(owner_id).subquery()
    return set(session.scalars(select(held.c.sha256).where(held.c.sha256.in_(digests))))
