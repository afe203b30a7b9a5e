"""Liveness, readiness (database, broker, store) and Prometheus metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from persistence.database import ping
from persistence.queue import ping_broker
from service.deps import AppState, StateDep

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


@router.get("/metrics", summary="Prometheus metrics", response_class=Response)
def metrics(state: StateDep) -> Response:
    """Metrics in the Prometheus text format."""
    return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
