"""Fixtures of the API tests: a real PostgreSQL database and a real Redis broker.

Each test session gets its own PostgreSQL database and its own Redis key prefix, so
parallel suites on the same servers never see each other's jobs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from persistence.models import Job
from service.app import build_state, create_app
from service.deps import AppState
from service.settings import ServiceSettings
from tests.conftest import REDIS_URL

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "tests" / "models"
LOOPBACK_CLIENT = ("127.0.0.1", 50000)
"""The client address of test requests: keyless apps answer loopback clients only
(TestClient's default, `testclient`, is no address)."""


def make_settings(
    tmp_path: Path, pg_url: str, redis_prefix: str, **overrides: object
) -> ServiceSettings:
    """Settings against the session's database and broker, with test overrides."""
    values: dict[str, object] = {
        "data_dir": tmp_path / "data",
        "database_url": pg_url,
        "broker_url": REDIS_URL,
        "broker_key_prefix": redis_prefix,
        "auto_migrate": False,
        "reaper_interval_s": 3600.0,
    }
    values.update(overrides)
    return ServiceSettings(**values)  # type: ignore[arg-type]


TRUNCATE_ALL = (
    "TRUNCATE stage_events, artifacts, jobs, api_keys, blobs, worker_processes, metric_totals"
    " CASCADE"
)


def truncate(engine: Engine, statement: str = TRUNCATE_ALL) -> None:
    """Empty the tables; retried when PostgreSQL picks this TRUNCATE as a deadlock's
    victim (a session of the app under test, still finishing a read of two tables,
    may hold one of them: CI saw it once in a teardown)."""
    for attempt in range(5):
        try:
            with engine.begin() as conn:
                conn.execute(text(statement))
            return
        except OperationalError as exc:
            if attempt == 4 or "deadlock detected" not in str(exc):
                raise
            time.sleep(0.2 * (attempt + 1))


def _truncate(state: AppState) -> None:
    truncate(state.engine)


@pytest.fixture
def settings(tmp_path: Path, pg_url: str, redis_prefix: str) -> ServiceSettings:
    return make_settings(tmp_path, pg_url, redis_prefix)


@pytest.fixture
def state(settings: ServiceSettings) -> Iterator[AppState]:
    state = build_state(settings)
    _truncate(state)
    yield state
    _truncate(state)
    state.engine.dispose()


@pytest.fixture
def client(state: AppState) -> Iterator[TestClient]:
    with TestClient(create_app(state=state), client=LOOPBACK_CLIENT) as test_client:
        yield test_client


def model_file(name: str = "service_small.py") -> tuple[str, bytes]:
    """(file name, bytes) of a model fixture."""
    return name, (MODELS / name).read_bytes()


def embedded_client(data_dir: Path, **overrides: object) -> Iterator[TestClient]:
    """The API as `torchport serve` runs it under `data_dir`, with settings overrides."""
    settings = ServiceSettings(
        data_dir=data_dir,
        database_url=f"sqlite:///{data_dir / 'torchport.db'}",
        broker_url="filesystem://",
        reaper_interval_s=3600.0,
        **overrides,  # type: ignore[arg-type]
    )
    state = build_state(settings)
    with TestClient(create_app(state=state), client=LOOPBACK_CLIENT) as test_client:
        yield test_client
    state.engine.dispose()


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[TestClient]:
    """The API as `torchport serve` runs it: SQLite and the folder broker."""
    yield from embedded_client(tmp_path / "embedded")


@pytest.fixture(params=["postgresql", "sqlite"])
def any_setup(request: pytest.FixtureRequest) -> TestClient:
    """The API on PostgreSQL and Redis (`client`), then on the embedded setup."""
    client: TestClient = request.getfixturevalue(
        "client" if request.param == "postgresql" else "embedded"
    )
    return client


def job_row(job_id: str, model: str, weights: str, finished: datetime) -> Job:
    """A failed job's row, finished at `finished`, of these upload digests (for the
    collector's tests, which need no API)."""
    return Job(
        id=job_id,
        status="failed",
        options_json="{}",
        cache_key="k" * 64,
        model_sha256=model,
        model_name="m.py",
        weights_sha256=weights,
        weights_name="w.pt",
        created_at=finished,
        finished_at=finished,
    )
