"""Liveness, readiness (database, broker, store) and Prometheus metrics."""

from __future__ import annotations

import hmac
from typing import Annotated, Any

from fastapi import APIRouter, Header, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.concurrency import run_in_threadpool

from persistence.database import ping
from persistence.queue import ping_broker
from service.auth import from_this_machine
from service.deps import AppState, StateDep
from service.errors import Forbidden, RateLimited, Unauthorized

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness")
def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


def _check_all(state: AppState) -> dict[str, str]:
    checks: dict[str, str] = {}
    probes: dict[str, Any] = {
        "database": lambda: ping(state.engine),
        "broker": lambda: ping_broker(state.celery),
        "store": state.store.check,
    }
    for name, probe in probes.items():
        try:
            probe()
            checks[name] = "ok"
        except Exception as exc:
            checks[name] = f"error: {type(exc).__name__}: {exc}"[:300]
    return checks


@router.get(
    "/readyz",
    summary="Readiness",
    responses={503: {"description": "A dependency is down; `checks` says which."}},
)
async def readyz(state: StateDep) -> JSONResponse:
    """200 when the database, the broker and the artifact store all answer, else 503."""
    checks = await run_in_threadpool(_check_all, state)
    ready = all(value == "ok" for value in checks.values())
    return JSONResponse(
        status_code=200 if ready else 503,
        content={"status": "ready" if ready else "unready", "checks": checks},
    )


def _metrics_access(request: Request, state: AppState, authorization: str | None) -> None:
    """Who may scrape: with `TORCHPORT_METRICS_TOKEN` set, whoever presents it as a bearer
    token (API keys do not open it: the metrics are every tenant's); without one, while
    API keys are configured, only this machine's own clients (a sidecar, a local agent);
    without keys, as any route (`service.app.LoopbackOnlyWithoutKeys`).

    A wrong token counts as a failed authentication of the client address, as a wrong API
    key does (`service.deps.get_caller`), so guessing it is throttled the same way.

    Raises:
        Unauthorized: a token is set and the request does not present it.
        RateLimited: so, by an address over its burst of failed authentications.
        Forbidden: no token is set, keys are, and the client is not this machine.
    """
    token = state.settings.metrics_token
    if token is None:
        local = from_this_machine(
            request.client.host if request.client else None,
            (name for name, _ in request.scope.get("headers", [])),
        )
        if not local and state.authenticator.keys_configured():
            raise Forbidden(
                "`/metrics` of a server with API keys answers only this machine's clients "
                "unless TORCHPORT_METRICS_TOKEN is set",
                hint="set TORCHPORT_METRICS_TOKEN on the API and have Prometheus send "
                "`Authorization: Bearer <token>`",
                details={"reason": "metrics_token_not_set"},
            )
        return
    scheme, _, presented = (authorization or "").partition(" ")
    expected = token.get_secret_value().encode("utf-8")
    if scheme.lower() == "bearer" and hmac.compare_digest(
        presented.strip().encode("utf-8"), expected
    ):
        return
    if authorization is not None:  # a request without the header guesses nothing
        address = request.client.host if request.client else "local"
        if (wait := state.auth_failure_limit.hit(address)) is not None:
            raise RateLimited(
                "too many failed authentications from this address",
                hint="check the metrics token you send, then retry after Retry-After seconds",
                retry_after_s=wait,
                details={"reason": "auth_failures"},
            )
    raise Unauthorized("`/metrics` needs the metrics token: Authorization: Bearer <token>")


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    responses={
        401: {"description": "`TORCHPORT_METRICS_TOKEN` is set and was not presented."},
        403: {
            "description": "API keys are configured, no metrics token is, and the client "
            'is not this machine (`details.reason = "metrics_token_not_set"`).'
        },
    },
)
async def metrics(
    request: Request,
    state: StateDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Response:
    """Metrics in the Prometheus text format, from memory: the database-backed ones are a
    snapshot refreshed every `TORCHPORT_METRICS_REFRESH_INTERVAL_S` (`service.metrics`)."""
    _metrics_access(request, state, authorization)
    return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
