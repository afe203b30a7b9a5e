"""`torchport gc` in a fresh process against an embedded data directory (SQLite and the
local store), as an operator runs it."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

from sqlalchemy import select, update

from persistence import retention
from persistence.database import make_engine, make_session_factory, migrate, transaction
from persistence.models import Blob, Job, utcnow
from tests.service.conftest import job_row

ROOT = Path(__file__).resolve().parents[2]


def gc(data_dir: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", "gc", "--data-dir", str(data_dir), *extra],
        cwd=ROOT,
        env={**clean, "TORCHPORT_RETENTION_HOURS": "24"},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_gc_dry_run_then_reclaims_what_expired(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    url = f"sqlite:///{data_dir / 'torchport.db'}"
    migrate(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    store_root = data_dir / "artifacts"
    digests = {}
    for name in ("model", "weights-old", "weights-new"):
        data = name.encode() * 500
        sha = hashlib.sha256(data).hexdigest()
        blob = store_root / sha[:2] / sha
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        retention.lease(sessions, {sha: len(data)})
        digests[name] = sha
    now = utcnow()
    with transaction(sessions) as session:
        for job_id, weights, finished in (
            ("old", "weights-old", now - timedelta(hours=30)),
            ("new", "weights-new", now - timedelta(hours=1)),
        ):
            session.add(job_row(job_id, digests["model"], digests[weights], finished))
        session.execute(update(Blob).values(leased_at=now - timedelta(hours=30)))
    old_blob = store_root / digests["weights-old"][:2] / digests["weights-old"]

    dry = gc(data_dir, "--dry-run", "--json")

    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout) == {
        "dry_run": True,
        "retention_hours": 24.0,
        "expired_jobs": ["old"],
        "deleted_blobs": [{"sha256": digests["weights-old"], "size": len(b"weights-old") * 500}],
        "deleted_bytes": len(b"weights-old") * 500,
    }
    assert old_blob.exists()
    with sessions() as session:
        assert session.scalar(select(Job.expired_at).where(Job.id == "old")) is None

    done = gc(data_dir)

    assert done.returncode == 0, done.stderr
    assert f"deleted blob {digests['weights-old']}" in done.stdout
    assert not old_blob.exists()
    assert sorted(p.name for p in store_root.rglob("*") if p.is_file()) == sorted(
        [digests["model"], digests["weights-new"]]
    )
    with sessions() as session:
        expired = dict(session.execute(select(Job.id, Job.expired_at)).all())
    assert expired["old"] is not None and expired["new"] is None
    again = gc(data_dir, "--json")
    assert json.loads(again.stdout)["expired_jobs"] == []
    assert json.loads(again.stdout)["deleted_blobs"] == []
    engine.dispose()


def test_gc_of_an_unreachable_database_exits_1(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    result = subprocess.run(
        [sys.executable, "-m", "torchport.cli", "gc"],
        cwd=ROOT,
        env={
            **clean,
            "TORCHPORT_DATA_DIR": str(tmp_path),
            "TORCHPORT_DATABASE_URL": "postgresql://torchport@127.0.0.1:1/none",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stdout == ""
