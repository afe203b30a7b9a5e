"""`torchport db upgrade` against real databases: a fresh SQLite file and PostgreSQL.

The command runs as a deployment runs it: the `torchport` CLI in a fresh process, the
database named only by `TORCHPORT_DATABASE_URL` (or the data directory's default).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect, text

from persistence.database import ALEMBIC_INI, MIGRATIONS_DIR
from persistence.models import Base
from tests.conftest import PG_ADMIN

ROOT = Path(__file__).resolve().parents[2]

HEAD = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
"""The newest migration shipped (read from the scripts, not from the command)."""
TABLES = {
    "api_keys",
    "artifacts",
    "blobs",
    "jobs",
    "metric_totals",
    "stage_events",
    "worker_environments",
    "worker_processes",
    "zip_members",
}


def db_upgrade(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", "db", "upgrade", *extra],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def tables_and_revision(url: str) -> tuple[set[str], str | None]:
    engine = create_engine(url)
    try:
        names = set(inspect(engine).get_table_names())
        with engine.connect() as connection:
            revision = connection.execute(text("SELECT version_num FROM alembic_version")).scalar()
    finally:
        engine.dispose()
    return names, revision


def test_the_models_tables_are_the_ones_checked() -> None:
    # Keeps TABLES honest: a new table in the models must be created by the migrations too.
    assert set(Base.metadata.tables) == TABLES
    assert HEAD is not None and HEAD >= "0002"


def test_db_upgrade_creates_the_tables_in_the_default_sqlite_file(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    database = data_dir / "torchport.db"
    assert not database.exists()

    first = db_upgrade({"TORCHPORT_DATA_DIR": str(data_dir)})

    assert first.returncode == 0, first.stderr
    assert first.stdout.strip() == (
        f"sqlite:///{database}: migrated from empty to revision {HEAD} (head)"
    )
    names, revision = tables_and_revision(f"sqlite:///{database}")
    assert names == TABLES | {"alembic_version"}
    assert revision == HEAD

    again = db_upgrade({"TORCHPORT_DATA_DIR": str(data_dir)}, "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {
        "database": f"sqlite:///{database}",
        "from": HEAD,
        "revision": HEAD,
        "head": HEAD,
    }


def test_db_upgrade_follows_the_database_url_over_the_data_dir(tmp_path: Path) -> None:
    data_dir, elsewhere = tmp_path / "data", tmp_path / "elsewhere.db"
    result = db_upgrade(
        {"TORCHPORT_DATA_DIR": str(data_dir), "TORCHPORT_DATABASE_URL": f"sqlite:///{elsewhere}"}
    )
    assert result.returncode == 0, result.stderr
    assert tables_and_revision(f"sqlite:///{elsewhere}") == (TABLES | {"alembic_version"}, HEAD)
    assert not (data_dir / "torchport.db").exists()


def test_db_upgrade_of_an_unreachable_database_exits_1(tmp_path: Path) -> None:
    result = db_upgrade(
        {
            "TORCHPORT_DATA_DIR": str(tmp_path),
            "TORCHPORT_DATABASE_URL": "postgresql://torchport:s3cret@127.0.0.1:1/none",
        }
    )
    assert result.returncode == 1
    assert "postgresql://torchport:***@127.0.0.1:1/none" in result.stderr
    assert "OperationalError" in result.stderr
    assert "s3cret" not in result.stderr + result.stdout


@pytest.fixture
def pg_database() -> Iterator[str]:
    """An empty PostgreSQL database of its own, dropped afterwards."""
    name = f"torchport_dbcli_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


def test_db_upgrade_migrates_postgresql(tmp_path: Path, pg_database: str) -> None:
    # The driver spelled as the deployments spell it (Compose, the Kubernetes Secret).
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_database}"
    assert table_names(url) == set()

    result = db_upgrade({"TORCHPORT_DATA_DIR": str(tmp_path), "TORCHPORT_DATABASE_URL": url})

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{url}: migrated from empty to revision {HEAD} (head)"
    assert tables_and_revision(url) == (TABLES | {"alembic_version"}, HEAD)
    assert not (tmp_path / "torchport.db").exists()
    again = db_upgrade({"TORCHPORT_DATA_DIR": str(tmp_path), "TORCHPORT_DATABASE_URL": url})
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"{url}: already at revision {HEAD} (head)"


def table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def alembic_config(url: str) -> Config:
    """Alembic's configuration of our migrations, for the database at `url`."""
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    return config


def test_0003_moves_each_jobs_callback_url_out_of_its_options(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = alembic_config(url)
    command.upgrade(config, "0002")
    engine = create_engine(url)
    hook = "https://hooks.example.com/x"
    with engine.begin() as connection:
        for job_id, options in (
            ("with", {"strict": True, "callback_url": hook}),
            ("without", {"strict": False}),
        ):
            connection.execute(
                text(
                    "INSERT INTO jobs (id, status, options_json, cache_key, cache_hit, queue, "
                    "model_sha256, model_name, attempts, cancel_requested, webhook_attempts, "
                    "created_at) VALUES (:id, 'queued', :options, :key, 0, 'cpu', :sha, "
                    "'m.py', 0, 0, 0, CURRENT_TIMESTAMP)"
                ),
                {"id": job_id, "options": json.dumps(options), "key": "k" * 64, "sha": "a" * 64},
            )
    command.upgrade(config, "0003")
    with engine.connect() as connection:
        rows = {
            row[0]: (json.loads(row[1]), row[2])
            for row in connection.execute(text("SELECT id, options_json, callback_url FROM jobs"))
        }
    assert rows == {"with": ({"strict": True}, hook), "without": ({"strict": False}, None)}
    command.downgrade(config, "0002")
    with engine.connect() as connection:
        back = connection.execute(text("SELECT options_json FROM jobs WHERE id = 'with'")).scalar()
    assert json.loads(back) == {"strict": True, "callback_url": hook}
    engine.dispose()


def test_0004_records_the_blobs_jobs_refer_to_and_goes_back(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = alembic_config(url)
    command.upgrade(config, "0003")
    engine = create_engine(url)
    model, weights, program = "a" * 64, "b" * 64, "c" * 64
    with engine.begin() as connection:
        for job_id, job_weights in (("one", weights), ("two", None)):
            connection.execute(
                text(
                    "INSERT INTO jobs (id, status, options_json, cache_key, cache_hit, queue, "
                    "model_sha256, model_name, weights_sha256, attempts, cancel_requested, "
                    "webhook_attempts, created_at) VALUES (:id, 'succeeded', '{}', :key, 0, "
                    "'cpu', :model, 'm.py', :weights, 0, 0, 0, CURRENT_TIMESTAMP)"
                ),
                {"id": job_id, "key": "k" * 64, "model": model, "weights": job_weights},
            )
            connection.execute(
                text(
                    "INSERT INTO artifacts (job_id, name, sha256, size, media_type, created_at) "
                    "VALUES (:id, 'program.pt2', :sha, 1234, 'application/zip', CURRENT_TIMESTAMP)"
                ),
                {"id": job_id, "sha": program},
            )
    command.upgrade(config, "0004")
    with engine.connect() as connection:
        blobs = dict(connection.execute(text("SELECT sha256, size FROM blobs")).all())
        expired = connection.execute(text("SELECT expired_at FROM jobs")).scalars().all()
    assert blobs == {model: None, weights: None, program: 1234}
    assert expired == [None, None]
    assert {"ix_jobs_weights_sha256", "ix_artifacts_sha256"} <= {
        index["name"]
        for table in ("jobs", "artifacts")
        for index in inspect(engine).get_indexes(table)
    }
    command.downgrade(config, "0003")
    assert "blobs" not in inspect(engine).get_table_names()
    assert "expired_at" not in {column["name"] for column in inspect(engine).get_columns("jobs")}
    with engine.connect() as connection:
        assert connection.execute(text("SELECT count(*) FROM jobs")).scalar() == 2
    engine.dispose()
