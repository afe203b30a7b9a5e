"""`torchport serve` as a user starts it after changing the environment: from a directory
of their own, which it leaves as it was, and with the environment record of its last start
replaced at once, not once the sandbox started and the import checks ran."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from persistence.database import make_engine, make_session_factory, migrate
from persistence.environments import record_environment
from schemas import EnvironmentDescription, LibraryInfo
from tests.integration.conftest import free_port

pytestmark = pytest.mark.slow

SERVE = (sys.executable, "-m", "torchport.cli", "serve")

STALE = EnvironmentDescription(
    python="3.0.0",
    platform="an earlier start",
    torch="0.0.1",
    libraries=[
        LibraryInfo(name="torch", version="0.0.1", model_library=True, imports=True),
        LibraryInfo(name="transformers", version=None, model_library=True, imports=False),
    ],
    described_at=datetime.now(UTC) - timedelta(days=1),
)
"""What the same host's worker recorded before a `pip install`: other versions."""


def _environment(url: str) -> dict[str, Any] | None:
    try:
        workers = httpx.get(f"{url}/v1/environment", timeout=2).json()["workers"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None
    cpu = [w["environment"] for w in workers if w["queue"] == "cpu"]
    return cpu[0] if cpu else None


def test_serve_writes_nothing_here_and_replaces_the_environment_at_start(
    tmp_path: Path,
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    data = tmp_path / "data"
    data.mkdir()
    database = f"sqlite:///{data / 'torchport.db'}"
    migrate(database)
    engine = make_engine(database)
    try:
        record_environment(
            make_session_factory(engine),
            queue="cpu",
            hostname=socket.gethostname(),
            environment=STALE,
            at=STALE.described_at,
        )
    finally:
        engine.dispose()

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")}
    # no import answers kept for this environment: the checks take their seconds
    env.update(XDG_CACHE_HOME=str(tmp_path / "cache"), TORCHPORT_SANDBOX_WARM_LIBRARIES="[]")
    log = (tmp_path / "serve.log").open("wb")
    process = subprocess.Popen(
        [*SERVE, "--port", str(port), "--data-dir", str(data)],
        cwd=here,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    seen: list[dict[str, Any]] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and process.poll() is None:
            found = _environment(url)
            if found is not None and found["torch"] != STALE.torch:
                if not seen or found != seen[-1]:
                    seen.append(found)
                if found["check_duration_s"] is not None:
                    break
            time.sleep(0.2)
        assert list(here.iterdir()) == []
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        process.wait(60)
        log.close()
    assert list(here.iterdir()) == [], (tmp_path / "serve.log").read_text()[-2000:]
    assert seen, (tmp_path / "serve.log").read_text()[-2000:]
    first, last = seen[0], seen[-1]
    # The first record after the stale one is this start's packages, before any check:
    # the import answers are not known yet, the versions are.
    assert first["torch"] == metadata.version("torch")
    assert first["check_duration_s"] is None
    libraries = {lib["name"]: lib for lib in first["libraries"] if lib["model_library"]}
    assert libraries["torch"]["version"] == metadata.version("torch")
    assert libraries["torch"]["imports"] is None
    # Then the checked one.
    assert last["check_duration_s"] is not None
    checked = {lib["name"]: lib for lib in last["libraries"] if lib["model_library"]}
    assert checked["torch"]["imports"] is True
