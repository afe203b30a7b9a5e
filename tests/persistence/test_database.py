"""Migrations: they build exactly the schema the models describe, on PostgreSQL and SQLite."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from persistence.database import ALEMBIC_INI, MIGRATIONS_DIR, make_engine, migrate


def _check(url: str) -> None:
    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    engine = make_engine(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.check(config)  # raises when the models and the migrations disagree
    engine.dispose()


def test_postgres_schema_matches_the_models(pg_url: str) -> None:
    _check(pg_url)


def test_sqlite_migrates_in_wal_mode(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sub' / 'torchport.db'}"
    migrate(url)
    migrate(url)  # idempotent
    _check(url)
    engine = make_engine(url)
    with engine.connect() as connection:
        assert connection.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        tables = set(
            connection.execute(text("SELECT name FROM sqlite_master WHERE type='table'")).scalars()
        )
    assert {"jobs", "stage_events", "artifacts", "api_keys", "alembic_version"} <= tables
    engine.dispose()
