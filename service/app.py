"""The FastAPI application: `create_app()` builds it, `lifespan` owns its resources.

Run it with `torchport serve`, or `uvicorn --factory service.app:create_app --no-proxy-headers`
in production (the app reads `X-Forwarded-For` itself, from `TORCHPORT_TRUSTED_PROXIES` only).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.middleware.proxy_headers import ProxyHeadersMiddleware

from persistence import worker_processes
from persistence.database import make_engine, make_session_factory, migrate
from persistence.lifecycle import recover_lost_jobs
from persistence.models import utcnow
from persistence.notices import make_publisher, publish_after_commit
from persistence.queue import enqueue_export, make_celery
from persistence.retention import Collection, collect
from persistence.store import open_store
from service import web
from service.auth import Authenticator, is_loopback
from service.deps import AppState
from service.errors import Forbidden, install_error_handlers
from service.jobs import engine_fingerprint
from service.metrics import Metrics
from service.rate_limits import auth_failures_per_address, requests_per_key
from service.routes import artifact_zip, environment, exports, health
from service.settings import ServiceSettings
from service.streams import EventHub, StreamLimiter

logger = logging.getLogger(__name__)

STALE_WORKER_ROWS = timedelta(hours=1)
"""A worker process's row not renewed for this long is deleted by the reaper."""


def build_state(settings: ServiceSettings) -> AppState:
    """Connect to the database, the store and the broker as `settings` say."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # The database, the broker's messages and the store hold every tenant's job ids,
    # uploads and hashes: no other uid (a job's) may even list or stat them.
    with contextlib.suppress(OSError):  # a data dir we do not own keeps its mode
        os.chmod(settings.data_dir, 0o700)
    url = settings.resolved_database_url
    if settings.auto_migrate:
        migrate(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    broker_url = settings.resolved_broker_url
    publisher = make_publisher(broker_url, settings.broker_key_prefix, settings.data_dir)
    if publisher is not None:
        publish_after_commit(sessions, publisher)
    return AppState(
        settings=settings,
        engine=engine,
        sessions=sessions,
        store=open_store(settings.resolved_store_url, s3_endpoint_url=settings.s3_endpoint_url),
        celery=make_celery(settings),
        authenticator=Authenticator(sessions),
        rate_limit=requests_per_key(
            broker_url, settings.rate_limit_per_minute, key_prefix=settings.broker_key_prefix
        ),
        auth_failure_limit=auth_failures_per_address(
            broker_url,
            settings.auth_failures_burst,
            settings.auth_failures_per_minute,
            key_prefix=settings.broker_key_prefix,
        ),
        metrics=Metrics(sessions, settings.heartbeat_timeout_s),
        fingerprint=engine_fingerprint(),
        hub=EventHub(broker_url, settings.broker_key_prefix, data_dir=settings.data_dir),
        stream_limiter=StreamLimiter(
            broker_url, settings.max_streams_per_key, key_prefix=settings.broker_key_prefix
        ),
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
    # Worker processes killed without deleting their row: long gone, no gauge counts them.
    worker_processes.prune(state.sessions, utcnow() - STALE_WORKER_ROWS)


async def _reaper(state: AppState) -> None:
    while True:
        await asyncio.sleep(state.settings.reaper_interval_s)
        try:
            await run_in_threadpool(reap_once, state)
        except Exception:
            logger.exception("lost-job recovery failed; trying again later")


def collect_once(state: AppState) -> Collection:
    """One pass of the collector: expire jobs past their retention, delete the blobs no
    unexpired job refers to (`persistence.retention`)."""
    result = collect(state.sessions, state.store, retention=state.settings.retention)
    if result.expired_jobs or result.deleted:
        logger.info(
            "retention: %d jobs expired, %d blobs (%d bytes) deleted",
            len(result.expired_jobs),
            len(result.deleted),
            result.deleted_bytes,
        )
    return result


def refresh_metrics(state: AppState) -> None:
    """Read the database-backed metrics into the snapshot `/metrics` serves
    (`service.metrics.Metrics.refresh`)."""
    folded = state.metrics.refresh()
    if folded:
        logger.info("metrics: %d totals with labels outside their fixed sets folded", folded)


async def _metrics_refresher(state: AppState) -> None:
    while True:
        await asyncio.sleep(state.settings.metrics_refresh_interval_s)
        try:
            await run_in_threadpool(refresh_metrics, state)
        except Exception:
            logger.exception("refreshing the metrics failed; serving the last snapshot")


async def _collector(state: AppState) -> None:
    while True:  # at start too: `torchport serve` may never run an hour
        try:
            await run_in_threadpool(collect_once, state)
        except Exception:
            logger.exception("collecting expired files failed; trying again later")
        await asyncio.sleep(state.settings.gc_interval_s)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Build the state (unless a test injected one), run the reaper and the collector,
    release on shutdown."""
    state: AppState | None = getattr(app.state, "torchport", None)
    if state is None:
        state = build_state(app.state.settings)
        app.state.torchport = state
    if await run_in_threadpool(state.authenticator.keys_configured):
        logger.info("API keys configured: every call needs Authorization: Bearer <key>")
    else:
        logger.warning("no API keys configured: the API is open to anyone who can reach it")
    await state.hub.start()  # subscribed before the first stream loads its job
    try:  # the first scrape already has the database's values
        await run_in_threadpool(refresh_metrics, state)
    except Exception:
        logger.exception("reading the metrics failed; trying again later")
    tasks = [
        asyncio.create_task(_reaper(state)),
        asyncio.create_task(_collector(state)),
        asyncio.create_task(_metrics_refresher(state)),
    ]
    try:
        yield
    finally:
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await state.hub.stop()
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
                elapsed = time.perf_counter() - started
                state.metrics.observe_request(path, method, status["code"], elapsed)


_FORWARDED = (b"forwarded", b"x-forwarded-for", b"x-real-ip")
PROBE_PATHS = ("/healthz", "/readyz")


class LoopbackOnlyWithoutKeys:
    """A server without API keys answers loopback clients only, however it was started
    (`torchport serve`, or `uvicorn --factory service.app:create_app`): any other client
    gets `forbidden` 403 with a hint, unless `TORCHPORT_ALLOW_REMOTE_WITHOUT_KEYS`. A
    request that came through a proxy (`Forwarded`, `X-Forwarded-For`, `X-Real-IP`)
    counts as remote even from a loopback address: the proxy serves someone else, and
    a trusted `X-Forwarded-For: 127.0.0.1` must not open the server. `/healthz` and
    `/readyz` stay open for the orchestrator's probes (they say nothing about jobs)."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI) -> None:
        self.app = app
        self.fastapi_app = fastapi_app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in PROBE_PATHS:
            settings: ServiceSettings = self.fastapi_app.state.settings
            client = scope.get("client")
            local = is_loopback(client[0] if client else None) and not any(
                name in _FORWARDED for name, _ in scope.get("headers", [])
            )
            if not local and not settings.allow_remote_without_keys:
                state: AppState | None = getattr(self.fastapi_app.state, "torchport", None)
                if state is not None and not state.authenticator.keys_configured():
                    await self._refuse(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send) -> None:
        error = Forbidden(
            "this server has no API keys and answers only this machine's clients",
            hint="create a key (`torchport keys create NAME`) and send "
            "`Authorization: Bearer <key>`, or set TORCHPORT_ALLOW_REMOTE_WITHOUT_KEYS=true",
            details={"reason": "no_api_keys"},
        )
        response = JSONResponse(status_code=403, content=error.body().model_dump(mode="json"))
        await response(scope, receive, send)


def create_app(settings: ServiceSettings | None = None, state: AppState | None = None) -> FastAPI:
    """The torchport API; settings from the environment unless given."""
    from schemas.version import __version__

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
    app.include_router(artifact_zip.router)
    app.include_router(environment.router)
    app.include_router(health.router)
    web.mount(app)  # the browser pages at / and /web/ (after the API routes)
    app.add_middleware(LoopbackOnlyWithoutKeys, fastapi_app=app)
    app.add_middleware(MetricsMiddleware, fastapi_app=app)
    proxies = app.state.settings.trusted_proxies
    if proxies:
        # Outermost, so the loopback check and the limits see the client the proxies name.
        # The server runs without its own proxy handling (`--no-proxy-headers`): uvicorn's
        # default would trust X-Forwarded-For from any loopback peer.
        app.add_middleware(ProxyHeadersMiddleware, trusted_hosts=[str(net) for net in proxies])
    return app
