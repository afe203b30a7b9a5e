"""`torchport gc`: expire finished jobs past their retention and delete the stored blobs
no unexpired job refers to, once (the API does the same every TORCHPORT_GC_INTERVAL_S).

Database, store and retention come from the settings (`TORCHPORT_DATABASE_URL`,
`TORCHPORT_STORE_URL`, `TORCHPORT_RETENTION_HOURS`, else the data directory's defaults).
Safe beside running APIs and workers (`persistence.retention` says why).

Exit codes: 0 done (or, with `--dry-run`, nothing changed); 1 the database or the store
failed; 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED = 0, 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport gc`."""
    parser.add_argument("--data-dir", type=Path, help="data directory (TORCHPORT_DATA_DIR)")
    parser.add_argument(
        "--dry-run", action="store_true", help="print what would be reclaimed; change nothing"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    """One pass of the collector; prints what it reclaimed (or would); the exit code."""
    from persistence.database import make_engine, make_session_factory, migrate
    from persistence.retention import collect
    from persistence.store import open_store
    from service.settings import ServiceSettings

    settings = ServiceSettings(**({"data_dir": args.data_dir} if args.data_dir else {}))
    url = settings.resolved_database_url
    engine = None
    try:
        if not args.dry_run:
            migrate(url)
        engine = make_engine(url)
        store = open_store(settings.resolved_store_url, s3_endpoint_url=settings.s3_endpoint_url)
        result = collect(
            make_session_factory(engine),
            store,
            retention=settings.retention,
            dry_run=args.dry_run,
        )
    except Exception as exc:
        message = f"{type(exc).__name__}: {exc}".splitlines()[0][:500]
        print(f"torchport gc: {message}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        if engine is not None:
            engine.dispose()
    if args.json:
        print(
            json.dumps(
                {
                    "dry_run": result.dry_run,
                    "retention_hours": settings.retention_hours,
                    "expired_jobs": result.expired_jobs,
                    "deleted_blobs": [
                        {"sha256": sha, "size": size} for sha, size in result.deleted.items()
                    ],
                    "deleted_bytes": result.deleted_bytes,
                }
            )
        )
        return EXIT_OK
    verb = ("would expire", "would delete") if result.dry_run else ("expired", "deleted")
    for job_id in result.expired_jobs:
        print(f"{verb[0]} job {job_id}")
    for sha, size in result.deleted.items():
        print(f"{verb[1]} blob {sha} ({'unknown size' if size is None else f'{size} bytes'})")
    kept = "forever" if settings.retention is None else f"{settings.retention_hours:g} h"
    print(
        f"{verb[0]} {len(result.expired_jobs)} jobs, {verb[1]} {len(result.deleted)} blobs "
        f"({result.deleted_bytes} bytes); retention {kept}"
    )
    return EXIT_OK
