"""Per-key limits on a new job: jobs queued or running (`TORCHPORT_MAX_CONCURRENT_JOBS`)
and bytes held in the store (`TORCHPORT_STORAGE_QUOTA_BYTES`, counted by
`persistence.retention`)."""

from __future__ import annotations

from collections.abc import Mapping

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from persistence import retention
from persistence.models import Job
from service.errors import RateLimited, StorageQuotaExceeded


def check_key_limits(
    session: Session,
    key_id: str,
    uploads: Mapping[str, int],
    *,
    max_concurrent_jobs: int,
    storage_quota_bytes: int,
) -> None:
    """A key's limits on a new job, checked under the key's row lock (`jobs.submit`):
    its jobs queued or running, and the bytes it holds in the store with the new uploads
    (digest → size) it does not hold yet.

    Raises:
        RateLimited: `max_concurrent_jobs` queued or running already.
        StorageQuotaExceeded: over `storage_quota_bytes` with the new uploads (0: no quota).
    """
    active = (
        session.scalar(
            select(func.count())
            .select_from(Job)
            .where(Job.owner_id == key_id, Job.status.in_(("queued", "running")))
        )
        or 0
    )
    if active >= max_concurrent_jobs:
        raise RateLimited(
            f"this key already has {active} jobs queued or running",
            retry_after_s=5.0,
            details={"max_concurrent_jobs": max_concurrent_jobs},
        )
    if storage_quota_bytes == 0:
        return
    used = retention.stored_bytes(session, key_id)
    held = retention.held_digests(session, key_id, set(uploads))
    request = sum(size for sha, size in uploads.items() if sha not in held)
    if used + request > storage_quota_bytes:
        raise StorageQuotaExceeded(
            f"this key holds {used} bytes in the store; this submission's uploads "
            f"({request} bytes) would take it over its quota of {storage_quota_bytes} bytes",
            details={
                "used_bytes": used,
                "request_bytes": request,
                "limit_bytes": storage_quota_bytes,
            },
        )
