"""Scale-out on one machine: N worker process trees, one Redis, one PostgreSQL, one API.

    python bench/scaleout.py                      # 1, 2 and 4 workers, 40 jobs each
    python bench/scaleout.py --workers 1,2 --jobs 20 --json out/scaleout.json

Each worker is `torchport worker --queues cpu --concurrency 1`, started in its own session
(a separate process tree) and, when run as root, in its own UTS namespace with its own
hostname (`node-a`, `node-b`, …) — as separate machines would be. Jobs are submitted over
HTTP to a real API (`uvicorn service.app:create_app`); each is a distinct small model, so
no job is a cache hit. Throughput = jobs / (last finish - first submit).

`tests/deploy/test_scaleout.py` uses the same `Cluster` to show that 40 jobs on two
workers each run exactly once and spread over both. Needs Redis on 127.0.0.1:6379 and
PostgreSQL on 127.0.0.1:5432 (user `postgres`, trust auth); it creates and drops its own
database and uses its own Redis key prefix.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
import psycopg
import redis
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
FINAL = {"succeeded", "failed", "canceled"}

MODEL_TEMPLATE = """
import torch


class Scaled(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * {factor} + 1


model = Scaled()
example_args = (torch.randn(4, 8),)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class JobRecord:
    """What the database says about one job after the run."""

    id: str
    status: str
    worker: str | None
    attempts: int
    running_events: int


@dataclass
class Cluster:
    """An API and `workers` worker process trees against a private database and key prefix."""

    workers: int
    root: Path
    name: str = field(default_factory=lambda: f"torchport_scaleout_{uuid.uuid4().hex[:8]}")
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    api_url: str = ""

    @property
    def database_url(self) -> str:
        """The cluster's own PostgreSQL database."""
        return f"postgresql+psycopg://postgres@127.0.0.1:5432/{self.name}"

    @property
    def prefix(self) -> str:
        """The cluster's own Redis key prefix."""
        return f"{self.name}:"

    def environment(self, data_dir: Path, worker_name: str | None = None) -> dict[str, str]:
        """The TORCHPORT_* environment of one process of this cluster."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHPORT_")} | {
            "TORCHPORT_DATA_DIR": str(data_dir),
            "TORCHPORT_DATABASE_URL": self.database_url,
            "TORCHPORT_BROKER_URL": REDIS_URL,
            "TORCHPORT_BROKER_KEY_PREFIX": self.prefix,
            "TORCHPORT_STORE_URL": str(self.root / "store"),
            "TORCHPORT_WEBHOOK_SECRET": "s" * 40,
            "TORCHPORT_AUTO_MIGRATE": "false",
            "TORCHPORT_MAX_CONCURRENT_JOBS": "1000",
            "CUDA_VISIBLE_DEVICES": "",
        }
        if worker_name:
            env["TORCHPORT_WORKER_NAME"] = worker_name
        return env

    def __enter__(self) -> Cluster:
        from persistence.database import migrate

        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        migrate(self.database_url)
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        port = _free_port()
        self.api_url = f"http://127.0.0.1:{port}"
        api = [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory"]
        api += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
        self._spawn(api, self.environment(self.root / "api"), "api")
        for index in range(self.workers):
            host = f"node-{chr(ord('a') + index)}"
            command = [sys.executable, "-m", "torchport.cli", "worker", "--queues", "cpu"]
            command += ["--concurrency", "1"]
            if os.geteuid() == 0 and shutil.which("unshare"):
                # Its own UTS namespace: a hostname of its own, as on another machine.
                command = ["unshare", "--uts", "sh", "-c", f'hostname {host} && exec "$@"', "sh"]
                command += [sys.executable, "-m", "torchport.cli", "worker", "--queues", "cpu"]
                command += ["--concurrency", "1"]
            self._spawn(command, self.environment(self.root / host, host), host)
        self._wait_ready()

    def _spawn(self, command: list[str], env: dict[str, str], name: str) -> None:
        log = (self.root / f"{name}.log").open("wb")
        self.processes.append(
            subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )

    def _wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead:
                raise RuntimeError(
                    f"a cluster process exited at start: {dead}; logs in {self.root}"
                )
            try:
                if httpx.get(f"{self.api_url}/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the API did not start; logs in {self.root}")

    def submit(self, jobs: int) -> list[str]:
        """Submit `jobs` distinct models; returns the job ids."""
        ids = []
        with httpx.Client(base_url=self.api_url, timeout=30.0) as client:
            for index in range(jobs):
                source = MODEL_TEMPLATE.format(factor=index + 2).encode()
                answer = client.post(
                    "/v1/exports",
                    files={"model": (f"scaled_{index}.py", source, "text/x-python")},
                    data={"options": json.dumps({"verify": {"roundtrip": False}})},
                )
                answer.raise_for_status()
                ids.append(answer.json()["id"])
        return ids

    def wait(self, ids: list[str], timeout_s: float) -> None:
        """Wait until every job is final (or raise TimeoutError)."""
        engine = create_engine(self.database_url)
        try:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                with engine.connect() as conn:
                    done = conn.execute(
                        text("SELECT count(*) FROM jobs WHERE status = ANY(:final)"),
                        {"final": list(FINAL)},
                    ).scalar_one()
                if done >= len(ids):
                    return
                if any(p.poll() is not None for p in self.processes):
                    raise RuntimeError(f"a cluster process died; logs in {self.root}")
                time.sleep(0.2)
            raise TimeoutError(f"jobs not finished after {timeout_s} s; logs in {self.root}")
        finally:
            engine.dispose()

    def records(self) -> list[JobRecord]:
        """Every job with its worker, attempts and number of `running` events."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                rows = conn.execute(
                    text(
                        "SELECT j.id, j.status, j.worker, j.attempts, "
                        "(SELECT count(*) FROM stage_events e "
                        " WHERE e.job_id = j.id AND e.status = 'running' AND e.stage IS NULL) "
                        "FROM jobs j"
                    )
                ).all()
        finally:
            engine.dispose()
        return [JobRecord(*row) for row in rows]

    def span_s(self) -> float:
        """Seconds from the first job's creation to the last job's finish."""
        engine = create_engine(self.database_url)
        try:
            with engine.connect() as conn:
                first, last = conn.execute(
                    text("SELECT min(created_at), max(finished_at) FROM jobs")
                ).one()
        finally:
            engine.dispose()
        return float((last - first).total_seconds())

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(f"{self.prefix}*"):
            client.delete(key)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def node_of(worker: str | None) -> str:
    """The worker name part of a job's `worker` identity (`<name>:<pid>:<nonce>`)."""
    return (worker or "?").split(":")[0]


def measure(workers: int, jobs: int, timeout_s: float) -> dict[str, Any]:
    """Throughput of `jobs` small exports on `workers` worker processes."""
    with (
        tempfile.TemporaryDirectory(prefix="torchport-scaleout-") as tmp,
        Cluster(workers=workers, root=Path(tmp)) as cluster,
    ):
        time.sleep(3.0)  # let every worker finish its zygote warm-up before timing
        ids = cluster.submit(jobs)
        cluster.wait(ids, timeout_s)
        records = cluster.records()
        span = cluster.span_s()
    return {
        "workers": workers,
        "jobs": jobs,
        "succeeded": sum(r.status == "succeeded" for r in records),
        "seconds": round(span, 2),
        "jobs_per_s": round(jobs / span, 2),
        "per_worker": dict(Counter(node_of(r.worker) for r in records)),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure throughput for each worker count and print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    results = [measure(int(n), args.jobs, args.timeout) for n in args.workers.split(",")]
    print(f"CPU threads: {os.cpu_count()}, jobs per run: {args.jobs}\n")
    print("| workers | jobs/s | seconds | succeeded | jobs per worker |")
    print("| ---: | ---: | ---: | ---: | --- |")
    for r in results:
        spread = ", ".join(f"{k}: {v}" for k, v in sorted(r["per_worker"].items()))
        print(
            f"| {r['workers']} | {r['jobs_per_s']} | {r['seconds']} | {r['succeeded']} | {spread} |"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["succeeded"] == r["jobs"] for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
