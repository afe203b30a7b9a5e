"""Faults of the infrastructure: the broker restarted (and losing its messages), the whole
`torchport serve` killed with jobs in flight. No job is lost and none stays running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import (
    Stack,
    free_port,
    kill_group,
    slow_model,
    stack_env,
    wait_until,
)
from tests.service.conftest import MODELS, ROOT

pytestmark = pytest.mark.slow


def start_redis(port: int, tmp_path: Path) -> subprocess.Popen[bytes]:
    # No persistence: a restart loses every queued message, the worst case for us.
    proc = subprocess.Popen(
        [
            "redis-server",
            "--port",
            str(port),
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    import redis

    wait_until(lambda: _redis_up(redis.Redis(port=port)), 10)
    return proc


def _redis_up(client) -> bool:  # type: ignore[no-untyped-def]
    try:
        return bool(client.ping())
    except Exception:
        return False


def distinct_models(tmp_path: Path, count: int) -> list[Path]:
    paths = []
    for i in range(count):
        path = tmp_path / f"model_{i}.py"
        path.write_bytes((MODELS / "service_small.py").read_bytes() + f"\n# {i}\n".encode())
        paths.append(path)
    return paths


def test_queued_jobs_survive_a_broker_restart(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    port = free_port()
    redis_proc = start_redis(port, tmp_path)
    stack = Stack(
        tmp_path,
        stack_env(tmp_path, pg_url, f"redis://127.0.0.1:{port}/0", redis_prefix + "restart:"),
    )
    try:
        stack.start_api()
        models = distinct_models(tmp_path, 4)
        queued = [stack.submit(m)["id"] for m in models[:3]]
        redis_proc.kill()
        redis_proc.wait()
        # Submitted while the broker is down: accepted, sent once it is back.
        queued.append(stack.submit(models[3])["id"])
        redis_proc = start_redis(port, tmp_path)
        stack.start_worker()
        finished = [stack.wait_done(job_id, timeout=180) for job_id in queued]
        assert [job["status"] for job in finished] == ["succeeded"] * 4
    finally:
        stack.stop()
        redis_proc.kill()
        redis_proc.wait()


class Serve:
    """`torchport serve` as a user runs it, in its own process group."""

    def __init__(self, data_dir: Path, port: int, log: Path) -> None:
        env = {
            **os.environ,
            "TORCHPORT_HEARTBEAT_INTERVAL_S": "0.2",
            "TORCHPORT_HEARTBEAT_TIMEOUT_S": "2",
            "TORCHPORT_REAPER_INTERVAL_S": "0.5",
        }
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torchport.cli",
                "serve",
                "--port",
                str(port),
                "--data-dir",
                str(data_dir),
                "--workers",
                "1",
            ],
            env=env,
            cwd=ROOT,
            stdout=log.open("ab"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{port}"
        wait_until(self._up, 60)

    def _up(self) -> bool:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def crash(self) -> None:
        """kill -9 the server and its workers (with their sandboxes)."""
        for child in self.children():
            kill_group(child, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(10)

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True)
        return [int(pid) for pid in out.stdout.split()]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(30)


@pytest.fixture
def serve_port() -> Iterator[int]:
    yield free_port()


def test_serve_restart_finishes_jobs_in_flight(tmp_path: Path, serve_port: int) -> None:
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    server = Serve(data, serve_port, log)
    http = httpx.Client(base_url=server.url, timeout=30)
    try:
        with slow_model(tmp_path, 3).open("rb") as f:
            running = http.post("/v1/exports", files={"model": ("slow_3.py", f)}).json()["id"]
        with (MODELS / "service_small.py").open("rb") as f:
            waiting = http.post("/v1/exports", files={"model": ("small.py", f)}).json()["id"]
        wait_until(lambda: http.get(f"/v1/exports/{running}").json()["status"] == "running", 60)
        server.crash()
        server = Serve(data, serve_port, log)
        done = {}
        for job_id in (running, waiting):
            done[job_id] = wait_until(
                lambda job_id=job_id: (
                    (j := http.get(f"/v1/exports/{job_id}").json())["status"]
                    in ("succeeded", "failed", "canceled")
                    and j
                ),
                120,
            )
        assert done[running]["status"] == "succeeded", done[running]["error"]
        assert done[running]["attempts"] == 2
        assert done[waiting]["status"] == "succeeded", done[waiting]["error"]
    finally:
        http.close()
        workers = server.children()
        assert server.stop() == 0
    assert workers
    assert [pid for pid in workers if os.path.exists(f"/proc/{pid}")] == []
