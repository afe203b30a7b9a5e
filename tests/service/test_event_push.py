"""Event streams are woken by job notices over Redis, and limited per key (real PostgreSQL,
Redis and a real uvicorn server: TestClient buffers a whole streamed response).

Found by an attack run: 200 slow event streams, each polling the database every 50 ms, made
another tenant's `GET /v1/exports/{id}` 125 times slower.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import uvicorn
from sqlalchemy import event

from persistence.database import make_engine, make_session_factory, transaction
from persistence.lifecycle import claim, finish, record_stage
from persistence.notices import make_publisher, publish_after_commit
from schemas.errors import ErrorBody
from service.app import build_state, create_app
from service.auth import create_key
from service.deps import AppState
from tests.conftest import REDIS_URL
from tests.service.conftest import _truncate, make_settings, model_file

SLOW = 30.0
"""Poll and safety-reload intervals: only a notice can deliver an event sooner."""


@dataclass
class Api:
    url: str
    state: AppState
    keys: list[dict[str, str]]
    """Two API keys' headers (made before the servers start: they cache whether keys exist)."""
    queries: list[float] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _serve(state: AppState) -> Iterator[str]:
    port = _free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(state=state),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def apis(tmp_path: Path, pg_url: str, redis_prefix: str) -> Iterator[list[Api]]:
    """Two API replicas on one database and one Redis, streams slow to poll, 2 per key."""
    settings = make_settings(
        tmp_path,
        pg_url,
        redis_prefix,
        events_poll_interval_s=SLOW,
        events_safety_reload_s=SLOW,
        max_streams_per_key=2,
    )
    states = [build_state(settings), build_state(settings)]
    _truncate(states[0])
    keys = [_key(states[0]), _key(states[0])]
    servers = [_serve(state) for state in states]
    found = [Api(next(server), state, keys) for server, state in zip(servers, states, strict=True)]
    for api in found:
        event.listen(
            api.state.engine,
            "before_cursor_execute",
            lambda *args, api=api: api.queries.append(time.monotonic()),
        )
    yield found
    for server in servers:
        next(server, None)
    _truncate(states[0])
    for state in states:
        state.engine.dispose()


@pytest.fixture
def worker_sessions(pg_url: str, redis_prefix: str) -> Iterator[object]:
    """A worker's sessions: its own engine, publishing its events' job ids."""
    engine = make_engine(pg_url)
    sessions = make_session_factory(engine)
    publisher = make_publisher(REDIS_URL, redis_prefix)
    assert publisher is not None
    publish_after_commit(sessions, publisher)
    yield sessions
    engine.dispose()


def _key(state: AppState) -> dict[str, str]:
    with transaction(state.sessions) as session:
        return {"Authorization": f"Bearer {create_key(session, 'streams').secret}"}


def _submit(api: Api, headers: dict[str, str]) -> str:
    answer = httpx.post(
        f"{api.url}/v1/exports", files={"model": model_file()}, headers=headers, timeout=30
    )
    assert answer.status_code == 202, answer.text
    return str(answer.json()["id"])


class Follower(threading.Thread):
    """Reads one event stream, noting when each `event:` line arrived."""

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        super().__init__(daemon=True)
        self.url, self.headers = url, headers
        self.events: list[tuple[str, float]] = []
        self.status: int | None = None
        self.opened = threading.Event()
        self.client = httpx.Client(timeout=60)
        self.socket: socket.socket | None = None

    def run(self) -> None:
        try:
            with self.client.stream("GET", self.url, headers=self.headers) as stream:
                self.status = stream.status_code
                self.socket = stream.extensions["network_stream"].get_extra_info("socket")
                self.opened.set()
                for line in stream.iter_lines():
                    if line.startswith("event:"):
                        self.events.append((line.split(":", 1)[1].strip(), time.monotonic()))
        except (httpx.HTTPError, RuntimeError, OSError):
            pass  # the test closed the client: the stream is gone
        finally:
            self.opened.set()

    def close(self) -> None:
        """Hang up, as a client going away does (the server sees the connection close)."""
        if self.socket is not None:
            self.socket.shutdown(socket.SHUT_RDWR)
        self.join(10)
        self.client.close()

    def wait_for(self, count: int, timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert time.monotonic() < deadline, self.events
            time.sleep(0.005)


def test_a_workers_event_reaches_a_following_client_by_notice(
    apis: list[Api], worker_sessions: object
) -> None:
    api = apis[0]
    headers = api.keys[0]
    job_id = _submit(api, headers)
    assert claim(worker_sessions, job_id, "w") is not None  # type: ignore[arg-type]
    follower = Follower(f"{api.url}/v1/exports/{job_id}/events", headers)
    follower.start()
    follower.wait_for(2)  # queued, running
    delays = []
    for fraction in (0.25, 0.5, 0.75):
        sent = time.monotonic()
        record_stage(
            worker_sessions,  # type: ignore[arg-type]
            job_id,
            "w",
            stage="tracing",
            status="progress",
            fraction=fraction,
        )
        follower.wait_for(len(follower.events) + 1, timeout=5)
        delays.append(follower.events[-1][1] - sent)
    assert max(delays) < 1.0, delays  # polling would take 30 s
    # Idle, an open stream does not query the database.
    before = len(api.queries)
    time.sleep(1.0)
    assert len(api.queries) == before
    assert finish(worker_sessions, job_id, "w", status="succeeded", error=None, artifacts=[])  # type: ignore[arg-type]
    follower.join(10)
    assert [kind for kind, _ in follower.events][-2:] == ["stage", "job"]


def test_open_streams_are_limited_per_key_across_replicas(apis: list[Api]) -> None:
    headers, other = apis[0].keys
    jobs = [_submit(apis[0], headers) for _ in range(3)]
    followers = [
        Follower(f"{api.url}/v1/exports/{job_id}/events", headers)
        for api, job_id in zip(apis, jobs[:2], strict=True)
    ]
    for follower in followers:
        follower.start()
        assert follower.opened.wait(10)
        assert follower.status == 200
    # A third stream of the same key, on either replica, is refused.
    third = httpx.get(f"{apis[1].url}/v1/exports/{jobs[2]}/events", headers=headers, timeout=10)
    assert third.status_code == 429
    body = ErrorBody.model_validate(third.json())
    assert body.code == "rate_limited"
    assert body.details["reason"] == "too_many_streams"
    assert body.details["limit"] == 2
    assert int(third.headers["Retry-After"]) >= 1
    # Other keys are not affected; a finished job's stream is not counted.
    other_job = _submit(apis[0], other)
    other_follower = Follower(f"{apis[0].url}/v1/exports/{other_job}/events", other)
    other_follower.start()
    assert other_follower.opened.wait(10)
    assert other_follower.status == 200
    # Closing a stream gives its place back.
    followers[0].close()
    deadline = time.monotonic() + 10
    while True:
        with (
            httpx.Client(timeout=10) as client,
            client.stream(
                "GET", f"{apis[1].url}/v1/exports/{jobs[2]}/events", headers=headers
            ) as stream,
        ):
            if stream.status_code == 200:
                break
            assert stream.status_code == 429
        assert time.monotonic() < deadline, "the closed stream was never released"
        time.sleep(0.1)
    for follower in (followers[1], other_follower):
        follower.close()
