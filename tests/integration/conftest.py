"""A real deployment for integration tests: uvicorn API and Celery worker processes against
PostgreSQL and Redis (the session's database and key prefix), with the real sandbox."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing, suppress
from pathlib import Path

import httpx
import pytest

from tests.conftest import REDIS_URL, pg_url, redis_prefix
from tests.service.conftest import MODELS, ROOT

__all__ = ["pg_url", "redis_prefix"]


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(predicate, timeout: float, interval: float = 0.1):  # type: ignore[no-untyped-def]
    """Poll `predicate` until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"condition not met within {timeout} s")


def slow_model(tmp_path: Path, seconds: int) -> Path:
    """The slow model fixture under a name that sets its import-time sleep."""
    path = tmp_path / f"slow_{int(seconds)}.py"
    path.write_bytes((MODELS / "service_slow.py").read_bytes())
    return path


class Stack:
    """An API process and worker processes sharing one database, broker and store."""

    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.env = {**os.environ, **env}
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api: subprocess.Popen[bytes] | None = None
        self.workers: list[subprocess.Popen[bytes]] = []
        self.http = httpx.Client(base_url=self.url, timeout=30)

    def start_api(self) -> None:
        log = (self.tmp_path / "api.log").open("ab")
        self.api = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "service.app:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--log-level",
                "warning",
            ],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        wait_until(self._api_up, 30)

    def _api_up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def start_worker(self) -> subprocess.Popen[bytes]:
        log = (self.tmp_path / f"worker-{len(self.workers)}.log").open("ab")
        worker = subprocess.Popen(
            [sys.executable, "-m", "torchport.cli", "worker", "--loglevel", "WARNING"],
            env=self.env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        self.workers.append(worker)
        return worker

    def kill_worker(self, worker: subprocess.Popen[bytes]) -> None:
        """kill -9 the worker and everything in its process group (its zygote)."""
        kill_group(worker.pid, signal.SIGKILL)
        worker.wait(10)

    def submit(self, model: Path, **options: object) -> dict:
        import json

        with model.open("rb") as f:
            data = {"options": json.dumps(options)} if options else {}
            answer = self.http.post("/v1/exports", files={"model": (model.name, f)}, data=data)
        assert answer.status_code == 202, answer.text
        return answer.json()

    def job(self, job_id: str) -> dict:
        return self.http.get(f"/v1/exports/{job_id}").json()

    def wait_done(self, job_id: str, timeout: float = 120) -> dict:
        def done() -> dict | None:
            job = self.job(job_id)
            return job if job["status"] in ("succeeded", "failed", "canceled") else None

        return wait_until(done, timeout, 0.1)

    def wait_running(self, job_id: str, timeout: float = 60) -> dict:
        return wait_until(
            lambda: (j := self.job(job_id))["status"] == "running" and j, timeout, 0.05
        )

    def stop(self) -> None:
        self.http.close()
        for proc in [*self.workers, *([self.api] if self.api else [])]:
            if proc.poll() is None:
                kill_group(proc.pid, signal.SIGTERM)
        for proc in [*self.workers, *([self.api] if self.api else [])]:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                kill_group(proc.pid, signal.SIGKILL)
                proc.wait(5)


def kill_group(pid: int, sig: signal.Signals) -> None:
    with suppress(ProcessLookupError):
        os.killpg(pid, sig)


def stack_env(tmp_path: Path, database_url: str, broker_url: str, prefix: str) -> dict[str, str]:
    return {
        "TORCHPORT_DATA_DIR": str(tmp_path / "data"),
        "TORCHPORT_DATABASE_URL": database_url,
        "TORCHPORT_BROKER_URL": broker_url,
        "TORCHPORT_BROKER_KEY_PREFIX": prefix,
        "TORCHPORT_HEARTBEAT_INTERVAL_S": "0.2",
        "TORCHPORT_HEARTBEAT_TIMEOUT_S": "2",
        "TORCHPORT_REAPER_INTERVAL_S": "0.5",
        "TORCHPORT_REQUEUE_AFTER_S": "3",
        "TORCHPORT_METRICS_REFRESH_INTERVAL_S": "0.2",
    }


def api_and_worker(tmp_path: Path, pg_url: str, prefix: str) -> Iterator[Stack]:
    """An API and one worker on the session's database, under a Redis key `prefix`."""
    deployment = Stack(tmp_path, stack_env(tmp_path, pg_url, REDIS_URL, prefix))
    deployment.start_api()
    deployment.start_worker()
    try:
        yield deployment
    finally:
        deployment.stop()


@pytest.fixture(scope="module")
def stack(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, redis_prefix: str
) -> Iterator[Stack]:
    yield from api_and_worker(tmp_path_factory.mktemp("stack"), pg_url, redis_prefix + "stack:")
