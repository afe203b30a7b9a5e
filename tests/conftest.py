"""Settings and fixtures every test process shares: the real PostgreSQL and Redis each
session gets its own database and key prefix of (`pg_url`, `redis_prefix`).

Workers started by the tests (in this process or as `torchport serve` / `worker`
subprocesses, which inherit the environment) warm no model library: each one would spend
~20 s importing transformers, diffusers and peft twice (probe and zygote) before its first
job, and most of these tests start a worker of their own. The sandbox's own arenas
(tests/sandbox/conftest.py) and the model suite build `SandboxSettings` directly, so they
keep the default and the hostile and warm-library tests run against a warm zygote.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest
import redis

from persistence.database import migrate

os.environ.setdefault("TORCHPORT_SANDBOX_WARM_LIBRARIES", "[]")


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this session, migrated to the newest schema."""
    name = f"torchport_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    migrate(url)
    yield url
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def redis_prefix() -> Iterator[str]:
    """A Redis key prefix owned by this session; its keys are deleted at the end."""
    prefix = f"torchport-test-{uuid.uuid4().hex[:10]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(f"{prefix}*"):
        client.delete(key)
