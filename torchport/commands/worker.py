"""`torchport worker`: a Celery worker for production (broker, database, store from TORCHPORT_*).

Each worker process runs one job at a time in a sandboxed child forked from its warm
zygote; `--concurrency N` starts N such processes.
"""

from __future__ import annotations

import argparse
import os
import warnings

WEBHOOK_THREADS = 8
"""Deliveries a `--queues webhooks` worker process makes at once."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `torchport worker`."""
    parser.add_argument(
        "--queues",
        help="comma-separated queues (default cpu; gpu for CUDA; webhooks for completion "
        "callbacks, which needs no sandbox)",
    )
    parser.add_argument("--concurrency", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--loglevel", default="INFO", help="Celery log level (default INFO)")


def run(args: argparse.Namespace) -> int:
    """Run the worker until it is stopped; returns the exit code."""
    if args.queues:
        os.environ["TORCHPORT_QUEUES"] = args.queues
    if args.concurrency < 1:
        print("torchport worker: --concurrency must be at least 1")
        return 2
    if args.concurrency > 1:
        from worker.processes import WorkerGroup

        group = WorkerGroup(args.concurrency, loglevel=args.loglevel)
        group.start()
        try:
            return group.wait()
        finally:
            group.stop()
    from worker.celery_app import app, runs_exports, settings

    # The worker needs root only to hand each job its own unprivileged uid in the
    # sandbox; uploaded code never runs as root, so Celery's root warning misleads.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser")
    quiet = args.loglevel.upper() in ("WARNING", "ERROR", "CRITICAL")
    # Exports: one at a time per process (one sandbox). A webhooks-only worker waits on
    # the network, each delivery within its deadline: a few threads, no sandbox.
    pool = (
        ["--pool=solo"]
        if runs_exports()
        else ["--pool=threads", f"--concurrency={WEBHOOK_THREADS}"]
    )
    app.worker_main(
        [
            *(["--quiet"] if quiet else []),
            "worker",
            *pool,
            f"--queues={','.join(settings.queue_list)}",
            f"--hostname=torchport-{os.getpid()}@%h",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            f"--loglevel={args.loglevel}",
        ]
    )
    return 0
