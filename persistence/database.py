"""Database connections and migrations: SQLite by default, PostgreSQL by URL."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, sessionmaker

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
ALEMBIC_INI = Path(__file__).parent / "alembic.ini"


def _tune_sqlite(dbapi_connection: Any, connection_record: Any) -> None:
    # WAL lets the API read while a worker writes; busy_timeout makes writers wait
    # for each other instead of failing with "database is locked".
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def make_engine(url: str) -> Engine:
    """An engine for `url`; SQLite files get their folder created and WAL mode."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(engine, "connect", _tune_sqlite)
        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded attributes after commit (rows are read after writing)."""
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def transaction(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose work is committed on success and rolled back on error."""
    with factory() as session, session.begin():
        yield session


def migrate(url: str) -> None:
    """Bring the database at `url` to the newest schema (Alembic `upgrade head`)."""
    from alembic import command
    from alembic.config import Config

    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    engine = make_engine(url)
    try:
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, "head")
    finally:
        engine.dispose()


def ping(engine: Engine) -> None:
    """Raise unless the database answers a trivial query."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))


def upsert(session: Session, table: Any) -> Any:
    """`INSERT INTO table` of the session's database, which has `on_conflict_do_update`
    (both databases torchport runs on have an upsert)."""
    postgres = session.get_bind().dialect.name == "postgresql"
    return (postgresql.insert if postgres else sqlite.insert)(table)
