"""Failed authentication is rate limited per client address: in the process for the
embedded setup, in Redis (one count for every API replica) when Redis is the broker.

Found by an attack run: 700 requests with distinct invalid API keys were all answered 401
at ~130 requests/s and never throttled, so keys could be guessed as fast as the API
answered.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from persistence.database import transaction
from schemas.errors import ErrorBody
from service.app import build_state, create_app
from service.auth import create_key
from service.deps import AppState
from tests.service.conftest import _truncate, make_settings

BURST = 5
ATTACKER = ("127.0.0.1", 50000)
NEIGHBOUR = ("127.0.0.2", 50000)


def _guess() -> dict[str, str]:
    return {"Authorization": f"Bearer tp_{secrets.token_urlsafe(32)}"}


def _states(tmp_path: Path, pg_url: str, redis_prefix: str, broker_url: str) -> list[AppState]:
    settings = make_settings(
        tmp_path,
        pg_url,
        redis_prefix + f"{uuid.uuid4().hex[:8]}:",  # buckets of this test alone
        broker_url=broker_url,
        auth_failures_burst=BURST,
        auth_failures_per_minute=1,
    )
    return [build_state(settings), build_state(settings)]


@pytest.fixture(params=["filesystem://", "redis://127.0.0.1:6379/0"])
def replicas(
    request: pytest.FixtureRequest, tmp_path: Path, pg_url: str, redis_prefix: str
) -> Iterator[tuple[str, list[AppState]]]:
    """Two API instances on one database: the embedded broker (each counts in its own
    process) or Redis (they count together)."""
    states = _states(tmp_path, pg_url, redis_prefix, request.param)
    _truncate(states[0])
    yield request.param, states
    _truncate(states[0])
    for state in states:
        state.engine.dispose()


def _key(state: AppState) -> dict[str, str]:
    with transaction(state.sessions) as session:
        return {"Authorization": f"Bearer {create_key(session, 'owner').secret}"}


def test_guessing_keys_is_rate_limited_per_address(
    replicas: tuple[str, list[AppState]],
) -> None:
    broker, (state, _) = replicas
    valid = _key(state)  # before the app starts: keys are configured from the first request
    with (
        TestClient(create_app(state=state), client=ATTACKER) as attacker,
        TestClient(create_app(state=state), client=NEIGHBOUR) as neighbour,
    ):
        codes = [attacker.get("/v1/exports", headers=_guess()).status_code for _ in range(30)]
        assert codes == [401] * BURST + [429] * (30 - BURST), broker  # was 30 times 401
        limited = attacker.get("/v1/exports", headers=_guess())
        body = ErrorBody.model_validate(limited.json())
        assert (body.code, body.details["reason"]) == ("rate_limited", "auth_failures")
        assert int(limited.headers["Retry-After"]) >= 1
        assert body.hint
        # A valid key from the blocked address is still answered (its neighbours at that
        # address are not locked out); only failures are blocked.
        assert attacker.get("/v1/exports", headers=valid).status_code == 200
        assert attacker.get("/v1/exports", headers=_guess()).status_code == 429
        # Another address is not blocked, and a valid key never counts as a failure.
        for _ in range(BURST + 2):
            assert neighbour.get("/v1/exports", headers=valid).status_code == 200
        assert neighbour.get("/v1/exports", headers=_guess()).status_code == 401
        # Without a key at all nothing is guessed: still 401, not counted.
        assert neighbour.get("/v1/exports").status_code == 401


def test_replicas_count_failures_together_through_redis(
    replicas: tuple[str, list[AppState]],
) -> None:
    broker, states = replicas
    _key(states[0])
    with (
        TestClient(create_app(state=states[0]), client=ATTACKER) as one,
        TestClient(create_app(state=states[1]), client=ATTACKER) as two,
    ):
        codes = [
            (one, two)[i % 2].get("/v1/exports", headers=_guess()).status_code for i in range(20)
        ]
    if broker.startswith("redis://"):
        assert codes.count(401) == BURST, codes  # one count for both replicas
    else:
        assert codes.count(401) == 2 * BURST, codes  # each process counts its own
    assert codes.count(429) == 20 - codes.count(401)
