"""Limits that hold with more than one API replica, and a keyless app that answers only
loopback clients however it is started (real PostgreSQL and Redis).

Found by an attack run: the rate limit was a token bucket per API process (two replicas,
twice the rate), and a keyless server started through `uvicorn --factory
service.app:create_app` answered remote callers without any limit (the loopback-only
check lived in `torchport serve` only).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from persistence.database import transaction
from schemas.errors import ErrorBody
from service.app import build_state, create_app
from service.auth import create_key
from service.deps import AppState
from tests.service.conftest import LOOPBACK_CLIENT, _truncate, make_settings, model_file


def _replicas(
    tmp_path: Path, pg_url: str, redis_prefix: str, rate_limit_per_minute: int
) -> Iterator[list[AppState]]:
    """Two API instances on one database and one Redis, as two replicas are."""
    settings = make_settings(
        tmp_path,
        pg_url,
        redis_prefix,
        rate_limit_per_minute=rate_limit_per_minute,
        max_concurrent_jobs=2,
    )
    states = [build_state(settings), build_state(settings)]
    _truncate(states[0])
    yield states
    _truncate(states[0])
    for state in states:
        state.engine.dispose()


@pytest.fixture
def replicas(tmp_path: Path, pg_url: str, redis_prefix: str) -> Iterator[list[AppState]]:
    """Two replicas with a rate limit of 5 requests a minute."""
    yield from _replicas(tmp_path, pg_url, redis_prefix, rate_limit_per_minute=5)


@pytest.fixture
def busy_replicas(tmp_path: Path, pg_url: str, redis_prefix: str) -> Iterator[list[AppState]]:
    """The same, with a rate limit that does not get in the way."""
    yield from _replicas(tmp_path, pg_url, redis_prefix, rate_limit_per_minute=600)


def _key(state: AppState) -> str:
    with transaction(state.sessions) as session:
        return create_key(session, "replicas").secret


def test_two_replicas_share_one_rate_limit(replicas: list[AppState]) -> None:
    secret = _key(replicas[0])
    headers = {"Authorization": f"Bearer {secret}"}
    with (
        TestClient(create_app(state=replicas[0]), client=LOOPBACK_CLIENT) as one,
        TestClient(create_app(state=replicas[1]), client=LOOPBACK_CLIENT) as two,
    ):
        codes = [
            (one if i % 2 == 0 else two).get("/v1/exports", headers=headers).status_code
            for i in range(10)
        ]
        assert codes.count(200) == 5, codes  # was 10: five per replica
        assert codes[5:] == [429] * 5
        limited = two.get("/v1/exports", headers=headers)
        assert ErrorBody.model_validate(limited.json()).code == "rate_limited"
        assert int(limited.headers["Retry-After"]) >= 1
        # Another key has its own bucket.
        other = {"Authorization": f"Bearer {_key(replicas[1])}"}
        assert one.get("/v1/exports", headers=other).status_code == 200


def test_concurrent_submissions_to_two_replicas_respect_the_job_limit(
    busy_replicas: list[AppState],
) -> None:
    replicas = busy_replicas
    secret = _key(replicas[0])
    headers = {"Authorization": f"Bearer {secret}"}
    codes: list[int] = []
    with (
        TestClient(create_app(state=replicas[0]), client=LOOPBACK_CLIENT) as one,
        TestClient(create_app(state=replicas[1]), client=LOOPBACK_CLIENT) as two,
    ):
        start = threading.Barrier(8)

        def submit(index: int) -> None:
            client = one if index % 2 == 0 else two
            name, data = model_file()
            start.wait()
            answer = client.post(
                "/v1/exports",
                headers=headers,
                files={"model": (name, data + f"\n# {index}\n".encode())},
            )
            codes.append(answer.status_code)

        threads = [threading.Thread(target=submit, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        listed = one.get("/v1/exports?status=queued", headers=headers).json()["items"]
    assert sorted(codes) == [202, 202] + [429] * 6
    assert len(listed) == 2


@pytest.mark.parametrize("address", ["203.0.113.7", "10.0.0.5", "::ffff:8.8.8.8", "testclient"])
def test_a_keyless_app_refuses_remote_clients(state: AppState, address: str) -> None:
    with TestClient(create_app(state=state), client=(address, 40000)) as remote:
        for method, path in [
            ("GET", "/v1/exports"),
            ("POST", "/v1/exports"),
            ("GET", "/v1/environment"),
            ("GET", "/metrics"),
            ("GET", "/"),
        ]:
            answer = remote.request(method, path)
            assert answer.status_code == 403, (method, path)
            body = ErrorBody.model_validate(answer.json())
            assert body.code == "forbidden"
            assert body.hint
            assert body.details["reason"] == "no_api_keys"
        assert remote.get("/healthz").status_code == 200
        assert remote.get("/readyz").status_code == 200


def test_a_keyless_app_refuses_proxied_requests_even_from_loopback(state: AppState) -> None:
    with TestClient(create_app(state=state), client=LOOPBACK_CLIENT) as local:
        assert local.get("/v1/exports").status_code == 200
        assert local.get("/v1/exports", headers={"X-Forwarded-For": "127.0.0.1"}).status_code == 403
        assert local.get("/v1/exports", headers={"Forwarded": "for=127.0.0.1"}).status_code == 403
    with TestClient(create_app(state=state), client=("::1", 40000)) as local6:
        assert local6.get("/v1/exports").status_code == 200


def test_remote_clients_are_answered_once_a_key_exists_or_when_allowed(
    state: AppState, tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    allowed = make_settings(tmp_path, pg_url, redis_prefix, allow_remote_without_keys=True)
    open_state = build_state(allowed)
    try:
        with TestClient(create_app(state=open_state), client=("203.0.113.7", 1)) as remote:
            assert remote.get("/v1/exports").status_code == 200
    finally:
        open_state.engine.dispose()
    secret = _key(state)
    with TestClient(create_app(state=state), client=("203.0.113.7", 1)) as remote:
        assert remote.get("/v1/exports").status_code == 401
        ok = remote.get("/v1/exports", headers={"Authorization": f"Bearer {secret}"})
        assert ok.status_code == 200
