"""The FastAPI application: `create_app()` builds it, `lifespan` owns its resources.

Run it with `torchport serve`, or `uvicorn --factory service.app:create_app` in production.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service import web
from service.auth import Authenticator, RateLimiter
from service.database import make_engine, make_session_factory, migrate
from service.deps import AppState
from service.errors import install_error_handlers
from service.jobs import engine_fingerprint
from service.lifecycle import recover_lost_jobs
from service.metrics import Metrics
from service.queue import enqueue_export, make_celery
from service.routes import exports, health
from service.settings import ServiceSettings
from service.store import open_store

logger = logging.getLogger(__name__)


def build_state(settings: ServiceSettings) -> AppState:
    """Connect to the database, the store and the broker as `settings` say."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url
    if settings.auto_migrate:
        migrate(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    return AppState(
        settings=settings,
        engine=engine,
        sessions=sessions,
        store=open_store(settings.resolved_store_url, s3_endpoint_url=settings.s3_endpoint_url),
        celery=make_celery(settings),
        authenticator=Authenticator(sessions),
        rate_limiter=RateLimiter(settings.rate_limit_per_minute),
        metrics=Metrics(sessions),
        fingerprint=engine_fingerprint(),
    )


def reap_once(state: AppState) -> None:
    """One pass of lost-job recovery; re-sends the re-queued jobs after the commit."""
    recovery = recover_lost_jobs(
        state.sessions,
        heartbeat_timeout_s=state.settings.heartbeat_timeout_s,
        requeue_after_s=state.settings.requeue_after_s,
    )
    for job_id, queue in recovery.requeued:
        enqueue_export(state.celery, job_id, queue)


async def _reaper(state: AppState) -> None:
    while True:
        await asyncio.sleep(state.settings.reaper_interval_s)
        try:
            await run_in_threadpool(reap_once, state)
        except Exception:
            logger.exception("lost-job recovery failed; trying again later")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Build the state (unless a test injected one), run the reaper, release on shutdown."""
    state: AppState | None = getattr(app.state, "torchport", None)
    if state is None:
        state = build_state(app.state.settings)
        app.state.torchport = state
    if await run_in_threadpool(state.authenticator.keys_configured):
        logger.info("API keys configured: every call needs Authorization: Bearer <key>")
    else:
        logger.warning("no API keys configured: the API is open to anyone who can reach it")
    reaper = asyncio.create_task(_reaper(state))
    try:
        yield
    finally:
        reaper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reaper
        state.engine.dispose()


class MetricsMiddleware:
    """Counts requests and their latency by route template (pure ASGI: streams pass through)."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = {"code": 500}

        async def send_with_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_with_status)
        finally:
            state: AppState | None = getattr(self.fastapi_app.state, "torchport", None)
            if state is not None:
                route = scope.get("route")
                path = getattr(route, "path", "unmatched")
                method = scope.get("method", "")
                state.metrics.requests.labels(path, method, str(status["code"])).inc()
                state.metrics.latency.labels(path, method).observe(time.perf_counter() - started)


def create_app(settings: ServiceSettings | None = None, state: AppState | None = None) -> FastAPI:
    """The torchport API; settings from the environment unless given."""
    from torchport import __version__

    app = FastAPI(
        title="torchport",
        version=__version__,
        summary="PyTorch export as a service.",
        lifespan=lifespan,
    )
    app.state.settings = settings or (state.settings if state else ServiceSettings())
    if state is not None:
        app.state.torchport = state
    install_error_handlers(app)
    app.include_router(exports.router)
    app.include_router(health.router)
    web.mount(app)  # the browser pages at / and /web/ (after the API routes)
    app.add_middleware(MetricsMiddleware, fastapi_app=app)
    return app
