"""Worker tests reuse the API tests' real PostgreSQL database and Redis prefix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REDIS_URL, pg_url, redis_prefix
from tests.service.conftest import truncate
from worker.execution import WorkerContext
from worker.settings import WorkerSettings

__all__ = ["pg_url", "redis_prefix"]


@pytest.fixture
def worker_settings(tmp_path: Path, pg_url: str, redis_prefix: str) -> WorkerSettings:
    return WorkerSettings(
        data_dir=tmp_path / "data",
        database_url=pg_url,
        broker_url=REDIS_URL,
        broker_key_prefix=redis_prefix,
        heartbeat_interval_s=0.1,
        heartbeat_timeout_s=1.0,
        webhook_secret="w" * 32,
    )


@pytest.fixture
def context(worker_settings: WorkerSettings) -> Iterator[WorkerContext]:
    ctx = WorkerContext.create(worker_settings)
    truncate(ctx.engine, "TRUNCATE stage_events, artifacts, jobs, api_keys CASCADE")
    yield ctx
    truncate(ctx.engine, "TRUNCATE stage_events, artifacts, jobs, api_keys CASCADE")
    ctx.close()
