"""API keys, ownership, rate limits and concurrent-job limits."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from persistence.database import transaction
from service import auth
from service.app import build_state, create_app
from service.deps import AppState
from tests.service.conftest import make_settings, model_file


@pytest.fixture(autouse=True)
def _no_key_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CACHE_TTL_S", 0.0)


def new_key(state: AppState, name: str) -> auth.CreatedKey:
    with transaction(state.sessions) as session:
        return auth.create_key(session, name)


def bearer(key: auth.CreatedKey) -> dict[str, str]:
    return {"Authorization": f"Bearer {key.secret}"}


def test_without_keys_no_header_is_needed(client: TestClient) -> None:
    assert client.get("/v1/exports").status_code == 200


def test_with_keys_every_call_needs_a_valid_one(client: TestClient, state: AppState) -> None:
    key = new_key(state, "ci")
    missing = client.get("/v1/exports")
    assert missing.status_code == 401
    assert missing.json()["code"] == "unauthorized"
    assert missing.headers["www-authenticate"] == "Bearer"
    wrong = client.get("/v1/exports", headers={"Authorization": "Bearer tp_not-a-key"})
    assert wrong.status_code == 401
    basic = client.get("/v1/exports", headers={"Authorization": "Basic dXNlcjpwdw=="})
    assert basic.status_code == 401
    assert client.get("/v1/exports", headers=bearer(key)).status_code == 200
    refused = client.post("/v1/exports", files={"model": model_file()})
    assert refused.status_code == 401


def test_a_key_sees_only_its_own_jobs(client: TestClient, state: AppState) -> None:
    alice, bob = new_key(state, "alice"), new_key(state, "bob")
    job_id = client.post(
        "/v1/exports", files={"model": model_file()}, headers=bearer(alice)
    ).json()["id"]
    for method, path in [
        ("GET", f"/v1/exports/{job_id}"),
        ("DELETE", f"/v1/exports/{job_id}"),
        ("GET", f"/v1/exports/{job_id}/events"),
        ("GET", f"/v1/exports/{job_id}/uploads/model"),
        ("GET", f"/v1/exports/{job_id}/uploads/model/files/model.py"),
    ]:
        answer = client.request(method, path, headers=bearer(bob))
        assert answer.status_code == 404, path
        assert answer.json()["code"] == "not_found"
    assert client.get("/v1/exports", headers=bearer(bob)).json()["items"] == []
    mine = client.get("/v1/exports", headers=bearer(alice)).json()["items"]
    assert [item["id"] for item in mine] == [job_id]
    upload = client.get(f"/v1/exports/{job_id}/uploads/model", headers=bearer(alice))
    assert upload.status_code == 200 and upload.content == model_file()[1]
    # The same upload by another key is its own job, never the other key's cache.
    theirs = client.post("/v1/exports", files={"model": model_file()}, headers=bearer(bob))
    assert theirs.json()["id"] != job_id


def test_a_revoked_key_stops_working(client: TestClient, state: AppState) -> None:
    key, other = new_key(state, "old"), new_key(state, "other")
    assert client.get("/v1/exports", headers=bearer(key)).status_code == 200
    with transaction(state.sessions) as session:
        auth.revoke_key(session, key.id)
    assert client.get("/v1/exports", headers=bearer(key)).status_code == 401
    assert client.get("/v1/exports", headers=bearer(other)).status_code == 200


def test_rate_limit_answers_429_with_retry_after(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    state = build_state(make_settings(tmp_path, pg_url, redis_prefix, rate_limit_per_minute=3))
    key = new_key(state, "busy")
    with TestClient(create_app(state=state), client=("127.0.0.1", 50000)) as client:
        codes = [client.get("/v1/exports", headers=bearer(key)).status_code for _ in range(4)]
        assert codes == [200, 200, 200, 429]
        limited = client.get("/v1/exports", headers=bearer(key))
        assert limited.json()["code"] == "rate_limited"
        assert int(limited.headers["retry-after"]) >= 1
    with state.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("TRUNCATE stage_events, artifacts, jobs, api_keys CASCADE"))


def test_concurrent_job_limit_per_key(tmp_path: Path, pg_url: str, redis_prefix: str) -> None:
    state = build_state(make_settings(tmp_path, pg_url, redis_prefix, max_concurrent_jobs=1))
    alice, bob = new_key(state, "alice"), new_key(state, "bob")
    with TestClient(create_app(state=state), client=("127.0.0.1", 50000)) as client:
        first = client.post(
            "/v1/exports", files={"model": ("a.py", b"model = 1\n")}, headers=bearer(alice)
        )
        assert first.status_code == 202
        second = client.post(
            "/v1/exports", files={"model": ("b.py", b"model = 2\n")}, headers=bearer(alice)
        )
        assert second.status_code == 429
        assert second.json()["code"] == "rate_limited"
        assert second.json()["details"]["max_concurrent_jobs"] == 1
        assert "retry-after" in second.headers
        other = client.post(
            "/v1/exports", files={"model": ("b.py", b"model = 2\n")}, headers=bearer(bob)
        )
        assert other.status_code == 202
    with state.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("TRUNCATE stage_events, artifacts, jobs, api_keys CASCADE"))


def test_keys_are_stored_hashed(state: AppState) -> None:
    key = new_key(state, "hashed")
    with state.sessions() as session:
        row = session.get(auth.ApiKey, key.id)
        assert row is not None
        assert row.key_hash == auth.hash_key(key.secret)
        assert key.secret not in (row.key_hash, row.webhook_secret)
