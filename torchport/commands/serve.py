"""`torchport serve`: the whole service on one machine with embedded defaults.

API + N local workers + SQLite + a local artifact directory + a folder broker, all under
one data directory. Ctrl-C stops the API, then the workers.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from pathlib import Path

logger = logging.getLogger("torchport.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport serve`."""
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    parser.add_argument("--workers", type=int, default=1, help="local worker processes (default 1)")
    parser.add_argument("--data-dir", type=Path, help="data directory (TORCHPORT_DATA_DIR)")
    parser.add_argument("--log-level", default="warning", help="server log level")


def is_loopback(host: str) -> bool:
    """Whether `host` is only reachable from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    """Serve until interrupted; returns the exit code."""
    import uvicorn

    from persistence.lifecycle import recover_lost_jobs
    from persistence.queue import enqueue_export
    from service.app import build_state, create_app
    from service.settings import ServiceSettings
    from worker.processes import WorkerGroup

    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if args.data_dir is not None:
        os.environ["TORCHPORT_DATA_DIR"] = str(args.data_dir.expanduser().resolve())
    settings = ServiceSettings()
    state = build_state(settings)
    keys = state.authenticator.keys_configured()
    if not keys and not is_loopback(args.host) and not settings.allow_remote_without_keys:
        print(
            f"torchport serve: refusing to bind {args.host} without API keys; create one with "
            "`torchport keys create NAME`, or bind 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    # The previous run's workers are gone for sure: their running jobs go back to the queue.
    recovery = recover_lost_jobs(
        state.sessions,
        heartbeat_timeout_s=settings.heartbeat_timeout_s,
        requeue_after_s=0.0,
        all_running_lost=True,
    )
    for job_id, queue in recovery.requeued:
        enqueue_export(state.celery, job_id, queue)
    data_env = {"TORCHPORT_DATA_DIR": str(settings.data_dir)}
    group = WorkerGroup(args.workers, env={**data_env, "TORCHPORT_QUEUES": "cpu"})
    group.start()
    # Completion callbacks have their own queue and process: never behind an export.
    webhooks = WorkerGroup(1, env={**data_env, "TORCHPORT_QUEUES": "webhooks"})
    webhooks.start()
    app = create_app(state=state)
    url = f"http://{args.host}:{args.port}"
    auth = "API keys required" if keys else "no API keys: loopback only"
    print(
        f"torchport serving on {url}  (data {settings.data_dir}, "
        f"{args.workers} worker{'s' if args.workers != 1 else ''}, {auth})",
        flush=True,
    )
    try:
        # The app reads X-Forwarded-For from TORCHPORT_TRUSTED_PROXIES only; uvicorn's own
        # handling would trust it from every loopback peer.
        uvicorn.run(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            access_log=False,
            proxy_headers=False,
        )
    finally:
        group.stop()
        webhooks.stop()
    print("torchport stopped", flush=True)
    return 0
