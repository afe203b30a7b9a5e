"""`torchport db upgrade`: bring the database to the newest schema, then exit.

The database is the one the settings name: `TORCHPORT_DATABASE_URL`, or the embedded
default `sqlite:///<data dir>/torchport.db`. Every deployment runs this once per release
before the API and the workers start (Compose service `migrate`, the Kubernetes Job
`torchport-migrate`); `torchport serve` migrates by itself.

Exit codes: 0 migrated (the revision is printed), 1 the database could not be migrated,
2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED = 0, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport db`."""
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    upgrade = sub.add_parser(
        "upgrade",
        help="migrate the database to the newest schema (TORCHPORT_DATABASE_URL, or the "
        "SQLite file in the data directory)",
        description="Migrate the database the settings name to the newest schema "
        "(Alembic upgrade head) and print its revision.",
    )
    upgrade.add_argument("--data-dir", type=Path, help="data directory (TORCHPORT_DATA_DIR)")
    upgrade.add_argument("--json", action="store_true", help="print the result as JSON")


def current_revision(url: str) -> str | None:
    """The Alembic revision the database at `url` is at; None for an unmigrated one."""
    from alembic.runtime.migration import MigrationContext

    from persistence.database import make_engine

    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    """The newest revision of the migrations shipped with this torchport."""
    from alembic.script import ScriptDirectory

    from persistence.database import MIGRATIONS_DIR

    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def run(args: argparse.Namespace) -> int:
    """Migrate; print the database (password hidden) and its revision; return the exit code."""
    from sqlalchemy.engine import make_url

    from persistence.database import migrate
    from service.settings import CommonSettings

    settings = CommonSettings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    url = settings.resolved_database_url
    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except Exception:  # an unparsable URL: migrate() reports it below
        shown = "<the configured database>"
    try:
        before = current_revision(url)
        migrate(url)
        after = current_revision(url)
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        if args.json:
            print(json.dumps({"database": shown, "error": message}))
        else:
            print(f"torchport db upgrade: {shown}: {message}", file=sys.stderr)
        return EXIT_FAILED
    head = head_revision()
    if args.json:
        print(json.dumps({"database": shown, "from": before, "revision": after, "head": head}))
    else:
        change = "already at" if before == after else f"migrated from {before or 'empty'} to"
        print(f"{shown}: {change} revision {after}" + (" (head)" if after == head else ""))
    return EXIT_OK if after == head else EXIT_FAILED
