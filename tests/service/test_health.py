"""Liveness, readiness, metrics, OpenAPI, settings validation, and a fuzz of the API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.app import build_state, create_app
from service.settings import ServiceSettings
from tests.service.conftest import make_settings, model_file
from worker.settings import WorkerSettings


def test_healthz_and_readyz(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}
    ready = client.get("/readyz")
    assert ready.status_code == 200
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok", "store": "ok"}


def test_readyz_names_the_broker_that_is_down(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    settings = make_settings(tmp_path, pg_url, redis_prefix, broker_url="redis://127.0.0.1:1/0")
    with TestClient(create_app(state=build_state(settings)), client=("127.0.0.1", 50000)) as client:
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert ready.json()["checks"]["database"] == "ok"
        assert ready.json()["checks"]["broker"].startswith("error")


def test_metrics_count_requests_and_jobs(client: TestClient) -> None:
    client.post("/v1/exports", files={"model": model_file()})
    client.app.state.torchport.metrics.refresh()  # type: ignore[attr-defined]
    text = client.get("/metrics").text
    assert 'torchport_jobs{status="queued"} 1.0' in text
    assert 'torchport_submissions_total{outcome="queued"} 1.0' in text
    assert 'route="/v1/exports",status="202"' in text


def test_openapi_and_docs(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "/v1/exports/{job_id}/artifacts/{name}" in spec["paths"]
    body = spec["paths"]["/v1/exports"]["post"]["requestBody"]["content"]
    required = body["multipart/form-data"]["schema"]["oneOf"]
    assert required == [{"required": ["model"]}, {"required": ["model_url"]}]
    assert client.get("/docs").status_code == 200


def test_settings_refuse_unsafe_values() -> None:
    with pytest.raises(ValidationError):
        ServiceSettings(visibility_timeout_s=60)
    with pytest.raises(ValidationError):
        ServiceSettings(heartbeat_interval_s=10, heartbeat_timeout_s=20)
    with pytest.raises(ValidationError):
        WorkerSettings(webhook_secret="short")


def test_settings_read_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TORCHPORT_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHPORT_MAX_MODEL_BYTES", "1234")
    settings = ServiceSettings()
    assert settings.upload_limits["model"] == 1234
    assert settings.resolved_database_url == f"sqlite:///{tmp_path / 'torchport.db'}"


@pytest.mark.slow
def test_fuzzed_requests_never_get_a_5xx(client: TestClient) -> None:
    import schemathesis
    from hypothesis import HealthCheck, settings

    async def from_loopback(scope: Any, receive: Any, send: Any) -> None:
        # schemathesis calls the app as `testclient`, no address: a keyless app answers
        # loopback clients only, so call it from 127.0.0.1.
        if scope["type"] == "http":
            scope = {**scope, "client": ("127.0.0.1", 50000)}
        await client.app(scope, receive, send)

    schema = schemathesis.openapi.from_asgi("/openapi.json", from_loopback)
    failures: list[str] = []
    calls: list[int] = []
    for operation in schema.get_all_operations():
        op = operation.ok()
        strategy = op.as_strategy()

        @settings(
            max_examples=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def check(case: object) -> None:
            response = case.call()  # type: ignore[attr-defined]
            calls.append(response.status_code)
            if response.status_code >= 500:
                failures.append(f"{case.method} {case.path}: {response.status_code}")  # type: ignore[attr-defined]

        from hypothesis import given

        given(strategy)(check)()
    assert failures == []
    assert len(calls) > 50
    assert any(400 <= code < 500 for code in calls)
    assert any(code < 400 for code in calls)


def test_every_setting_is_documented() -> None:
    from service.settings import CommonSettings
    from tests.service.conftest import ROOT
    from torchport.client import ClientSettings

    text = (ROOT / "docs" / "configuration.md").read_text()
    names = {
        f"`{name}`"
        for cls in (CommonSettings, ServiceSettings, WorkerSettings)
        for name in cls.variables()
    } | {f"`TORCHPORT_{name.upper()}`" for name in ClientSettings.model_fields}
    documented = {
        line.split(" | ")[0].removeprefix("| ")
        for line in text.splitlines()
        if line.startswith("| `TORCHPORT_")
    }
    assert documented == names
