"""`/v1/environment`: what the workers' jobs can import, as the workers described it."""

from __future__ import annotations

from fastapi import APIRouter

from persistence.environments import latest_environments
from schemas import EnvironmentList
from service.deps import CallerDep, SessionDep
from service.errors import RateLimited, Unauthorized, error_responses

router = APIRouter(prefix="/v1/environment", tags=["environment"])


@router.get(
    "",
    response_model=EnvironmentList,
    summary="The workers' environment",
    responses=error_responses(Unauthorized, RateLimited),
)
def get_environment(session: SessionDep, caller: CallerDep) -> EnvironmentList:
    """Per queue, the Python, torch and installed libraries (with versions, and whether each
    model library loads) its most recently started worker recorded at start; empty until
    a worker has started."""
    return latest_environments(session)
