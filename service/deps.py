"""FastAPI dependencies as `Annotated` aliases: the app's state, a session, the caller."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated

from celery import Celery
from fastapi import Depends, Header, Request
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from persistence.store import ArtifactStore
from service.auth import Authenticator, Caller
from service.errors import RateLimited, Unauthorized
from service.metrics import Metrics
from service.rate_limits import RateLimit
from service.settings import ServiceSettings
from service.streams import EventHub, StreamLimiter


@dataclass
class AppState:
    """Everything the app builds once at start-up."""

    settings: ServiceSettings
    engine: Engine
    sessions: sessionmaker[Session]
    store: ArtifactStore
    celery: Celery
    authenticator: Authenticator
    rate_limit: RateLimit
    """Requests per API key (`service.rate_limits.requests_per_key`)."""
    auth_failure_limit: RateLimit
    """Failed authentications per client address (`service.rate_limits`)."""
    metrics: Metrics
    fingerprint: str
    hub: EventHub
    stream_limiter: StreamLimiter


async def get_state(request: Request) -> AppState:
    """The app's state (async: no thread hop for a dictionary lookup)."""
    state: AppState = request.app.state.torchport
    return state


StateDep = Annotated[AppState, Depends(get_state)]


def get_session(state: StateDep) -> Iterator[Session]:
    """A session for one request; endpoints commit what they change."""
    with state.sessions() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]


async def get_caller(
    request: Request,
    state: StateDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Caller:
    """The authenticated caller, counted against its rate limit.

    The key is looked up first: a valid key is answered whatever its address's failures
    (the address may be a NAT or a proxy that others share). Only failures are counted,
    per client address (`request.client`: the peer, or the first hop that is not a trusted
    proxy, `TORCHPORT_TRUSTED_PROXIES`), and an address over its burst has its failures
    answered `rate_limited` instead of `unauthorized`.

    Async on purpose: lookups are cached (`service.auth.CACHE_TTL_S`), so the rare
    database query on a miss is cheaper on the loop than a thread hop on every request.
    """
    try:
        caller = state.authenticator.authenticate(authorization)
    except Unauthorized:
        # A request without the header guesses nothing: 401, not counted.
        if authorization is not None:
            address = request.client.host if request.client else "local"
            if (wait := state.auth_failure_limit.hit(address)) is not None:
                raise _too_many_failures(wait) from None
        raise
    if caller.key_id is not None:
        # Without keys the app answers loopback callers only (service.app), and the one
        # local user is not throttled. Shared through Redis by every replica.
        state.rate_limit.check(caller.identity)
    return caller


def _too_many_failures(retry_after_s: float) -> RateLimited:
    return RateLimited(
        "too many failed authentications from this address",
        hint="check the API key you send (`Authorization: Bearer tp_…`), then retry after "
        "Retry-After seconds",
        retry_after_s=retry_after_s,
        details={"reason": "auth_failures"},
    )


CallerDep = Annotated[Caller, Depends(get_caller)]
