"""What open event streams cost other callers, pushed (job notices over Redis) vs polled.

    python bench/event_streams.py [--streams 200] [--gets 200] [--json]

Starts the API (`uvicorn --factory service.app:create_app`) on a fresh PostgreSQL database
and the local Redis, twice: once as shipped (streams woken by job notices, reloading every
5 s in case one is lost) and once with streams reloading every 50 ms (what every stream did
before notices, and what they still do with the embedded broker). In each mode, it opens
`--streams` event streams on running jobs, then measures:
- the latency of another key's `GET /v1/exports/{id}` (p50, p99 of `--gets` requests);
- the database statements the API ran per second while the streams sat idle;
- the delay from a worker committing a stage event to a following client reading it
  (median and max of 20 events).

Needs PostgreSQL on 127.0.0.1:5432 (trust auth) and Redis on 127.0.0.1:6379.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import closing
from pathlib import Path

import httpx
import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from persistence.database import make_engine, make_session_factory, migrate, transaction  # noqa: E402
from persistence.lifecycle import claim, record_stage  # noqa: E402
from persistence.notices import make_publisher, publish_after_commit  # noqa: E402
from service.auth import create_key  # noqa: E402

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS = "redis://127.0.0.1:6379/0"
MODEL = ROOT / "tests" / "models" / "service_small.py"


def free_port() -> int:
    with closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def count_statements(url: str) -> int:
    """Statements run on the database so far (pg_stat_statements is not assumed:
    transactions committed plus rolled back, from pg_stat_database)."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (name,)
        ).fetchone()
        return int(row[0]) if row else 0


async def follow(url: str, headers: dict[str, str], seen: dict[str, list[float]], key: str):
    async with (
        httpx.AsyncClient(timeout=None) as client,
        client.stream("GET", url, headers=headers) as stream,
    ):
        assert stream.status_code == 200, stream.status_code
        async for line in stream.aiter_lines():
            if line.startswith("event:"):
                seen.setdefault(key, []).append(time.monotonic())


async def run_mode(reload_s: float, streams: int, gets: int) -> dict[str, float]:
    name = f"torchport_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    migrate(url)
    engine = make_engine(url)
    sessions = make_session_factory(engine)
    prefix = f"bench-{uuid.uuid4().hex[:8]}:"
    publisher = make_publisher(REDIS, prefix)
    assert publisher is not None
    publish_after_commit(sessions, publisher)  # this process plays the worker
    with transaction(sessions) as session:
        followers_key = create_key(session, "followers").secret
        reader_key = create_key(session, "reader").secret
    port = free_port()
    data = Path(tempfile.mkdtemp(prefix="torchport-bench-streams-"))
    env = {
        **os.environ,
        "TORCHPORT_DATA_DIR": str(data),
        "TORCHPORT_DATABASE_URL": url,
        "TORCHPORT_BROKER_URL": REDIS,
        "TORCHPORT_BROKER_KEY_PREFIX": prefix,
        "TORCHPORT_AUTO_MIGRATE": "false",
        "TORCHPORT_REAPER_INTERVAL_S": "3600",  # this process plays a silent worker
        "TORCHPORT_RATE_LIMIT_PER_MINUTE": "100000",
        "TORCHPORT_MAX_CONCURRENT_JOBS": "100000",
        "TORCHPORT_MAX_STREAMS_PER_KEY": "100000",
        "TORCHPORT_EVENTS_SAFETY_RELOAD_S": str(reload_s),
        "TORCHPORT_EVENTS_POLL_INTERVAL_S": str(reload_s),
    }
    api = subprocess.Popen(
        [
            *(sys.executable, "-m", "uvicorn", "--factory", "service.app:create_app"),
            *("--port", str(port), "--log-level", "warning"),
        ],
        cwd=ROOT,
        env=env,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if (await client.get("/healthz")).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert time.monotonic() < deadline, "the API did not start"
                await asyncio.sleep(0.1)
            follow_headers = {"Authorization": f"Bearer {followers_key}"}
            read_headers = {"Authorization": f"Bearer {reader_key}"}

            async def submit(headers: dict[str, str], i: int) -> str:
                source = MODEL.read_bytes() + f"\n# {i}\n".encode()
                answer = await client.post(
                    "/v1/exports", files={"model": ("m.py", source)}, headers=headers
                )
                assert answer.status_code == 202, answer.text
                return str(answer.json()["id"])

            job_ids = [await submit(follow_headers, i) for i in range(streams)]
            target = await submit(read_headers, -1)
            for job_id in job_ids:
                assert claim(sessions, job_id, "bench") is not None
            seen: dict[str, list[float]] = {}
            tasks = [
                asyncio.create_task(
                    follow(f"{base}/v1/exports/{j}/events", follow_headers, seen, j)
                )
                for j in job_ids
            ]
            while sum(len(v) >= 2 for v in seen.values()) < streams:  # queued, running
                await asyncio.sleep(0.05)
            await asyncio.sleep(1.0)

            before = count_statements(url)
            idle_started = time.monotonic()
            await asyncio.sleep(3.0)
            statements_per_s = (count_statements(url) - before) / (time.monotonic() - idle_started)

            latencies = []
            for _ in range(gets):
                started = time.perf_counter()
                answer = await client.get(f"/v1/exports/{target}", headers=read_headers)
                latencies.append(time.perf_counter() - started)
                assert answer.status_code == 200
                await asyncio.sleep(0.005)
            latencies.sort()

            delays = []
            probe = job_ids[0]
            for i in range(20):
                count = len(seen[probe])
                sent = time.monotonic()
                await asyncio.to_thread(
                    record_stage,
                    sessions,
                    probe,
                    "bench",
                    stage="tracing",
                    status="progress",
                    message=f"s{i}",
                )
                while len(seen[probe]) == count:
                    await asyncio.sleep(0.0005)
                delays.append(seen[probe][-1] - sent)
                await asyncio.sleep(0.05)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        api.terminate()
        api.wait(20)
        engine.dispose()
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    return {
        "get_p50_ms": 1000 * latencies[len(latencies) // 2],
        "get_p99_ms": 1000 * latencies[int(len(latencies) * 0.99) - 1],
        "db_transactions_per_s_idle": statements_per_s,
        "event_delay_median_ms": 1000 * statistics.median(delays),
        "event_delay_max_ms": 1000 * max(delays),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--gets", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = {}
    for label, reload_s in (("pushed (notices, 5 s reload)", 5.0), ("polled (50 ms)", 0.05)):
        results[label] = asyncio.run(run_mode(reload_s, args.streams, args.gets))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.streams} open streams; another key's GET /v1/exports/{{id}} x {args.gets}")
    print("| mode | GET p50 ms | GET p99 ms | DB transactions/s idle | event delay med / max ms |")
    print("| --- | --- | --- | --- | --- |")
    for label, r in results.items():
        print(
            f"| {label} | {r['get_p50_ms']:.1f} | {r['get_p99_ms']:.1f} | "
            f"{r['db_transactions_per_s_idle']:.0f} | "
            f"{r['event_delay_median_ms']:.1f} / {r['event_delay_max_ms']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
