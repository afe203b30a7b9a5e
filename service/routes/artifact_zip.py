"""`GET /v1/exports/{id}/artifacts.zip`: every artifact of a finished job in one download."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import StreamingResponse

from service import jobs
from service.artifact_zip import artifact_zip
from service.deps import CallerDep, SessionDep, StateDep
from service.errors import (
    Conflict,
    Expired,
    NotFound,
    RateLimited,
    Unauthorized,
    error_responses,
)

router = APIRouter(prefix="/v1/exports", tags=["exports"])


@router.get(
    "/{job_id}/artifacts.zip",
    summary="Download every artifact as one zip",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"application/zip": {}},
            "description": "A zip of the job's artifacts (JSON deflated, the rest stored) "
            "and `manifest.json` (the job id; each artifact's name, size, sha256 and "
            "media type), streamed as it is written.",
        },
        **error_responses(NotFound, Conflict, Expired, Unauthorized, RateLimited),
    },
)
def download_artifact_zip(
    job_id: str, session: SessionDep, state: StateDep, caller: CallerDep
) -> StreamingResponse:
    """All artifacts of a finished job in one zip, streamed from the store member by member
    (never whole in memory); the same rules as one artifact: `conflict` while the job has
    not finished, `expired` once its files were deleted, another key's job `not_found`."""
    job = jobs.get_job(session, job_id, caller)
    artifacts = jobs.finished_artifacts(job)
    return StreamingResponse(
        artifact_zip(state.store, job.id, artifacts),
        media_type="application/zip",
        headers={
            "Content-Disposition": f'attachment; filename="{job.id}.zip"',
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "private, no-store",
        },
    )
