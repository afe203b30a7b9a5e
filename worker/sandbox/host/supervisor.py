"""Supervision of one running job from the worker: its limits, what the worker learns
about it (`Watch`), and the loop that waits for its exit and kills its process group
when it runs out of time, memory or disk, or is canceled.

The job's pipes are read by pipes.py, its outputs by outputs.py; what the verdict
becomes is results.py's.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from schemas import ExportOptions
from worker.sandbox.host import quota
from worker.sandbox.host.tree import JobTree
from worker.sandbox.host.watch import Watch
from worker.sandbox.processes import read_rss
from worker.sandbox.settings import SandboxSettings

if TYPE_CHECKING:
    from worker.sandbox.host.zygote_client import ZygoteClient

__all__ = [
    "DEFAULT_MEMORY_MB",
    "Watch",
    "job_limits",
    "job_timeout",
    "kill_job",
    "measure_disk",
    "sized",
    "supervise",
]

DEFAULT_MEMORY_MB = 8192
"""A job's memory when its options set none and its uploads are small."""
MEMORY_PER_UPLOAD_MB = 2
"""MB of memory per MB of upload for a job whose options set no `memory_mb` (the weights
mapped once, plus what verification, the generation check and the round trip hold)."""
MEMORY_PER_UPLOAD_MB_PER_TARGET = 2
"""And per deployment target asked for: a converter holds its artifact's weights (an
ExecuTorch `8da4w` conversion of a 2.47 GB bfloat16 Llama peaked 6.6 GB above its job's
verification; its ONNX `8da4w` conversion 11.0 GB in all, ONNX Runtime's quantizer
holding the float32 model, over twice the checkpoint)."""
MEMORY_PER_UPLOAD_MB_EXECUTORCH = 4
"""Per `executorch` target instead: its float32 lowering of a 2.47 GB bfloat16 Llama
(widened, option `executorch.dtype`) peaked at 16,017 MB, the float32 weights and XNNPACK's
serialized copy of them held together (optimum-executorch's own lowering: 16,394 MB)."""
MEMORY_BASE_MB = 4096
DISK_PER_UPLOAD_MB = 4
"""MB of disk per MB of upload, when that is more than the worker's `disk_mb`: the
upload, its unpacked files, the program holding the weights again and one target's
files."""
FSIZE_PER_UPLOAD_MB = 3
"""MB of the largest file per MB of upload, when that is more than the worker's
`fsize_mb`: a bfloat16 or float16 checkpoint's weights widened to float32 in an ONNX
model's external data, with a tied LM head's weight transposed beside its embedding for
4-bit quantization (6.0 GB for a 2.47 GB bfloat16 Llama)."""


def sized(
    options: ExportOptions, upload_bytes: int, settings: SandboxSettings
) -> tuple[ExportOptions, SandboxSettings]:
    """The job's options and the worker's settings for it, sized from its uploads'
    bytes: `memory_mb` when the options set none (`MEMORY_PER_UPLOAD_MB` per MB of
    upload, `MEMORY_PER_UPLOAD_MB_PER_TARGET` more per target (`executorch`:
    `MEMORY_PER_UPLOAD_MB_EXECUTORCH`), plus `MEMORY_BASE_MB`; at
    least `DEFAULT_MEMORY_MB`, at most the worker's `max_memory_mb`), and the disk quota
    and largest file likewise (`DISK_PER_UPLOAD_MB`, at most `max_disk_mb`). The one
    place a job's limits are sized. The largest file grows with the disk quota, and is at
    least `FSIZE_PER_UPLOAD_MB` per MB of upload within it."""
    upload_mb = -(-upload_bytes // (1 << 20))
    if options.memory_mb is None:
        per_mb = MEMORY_PER_UPLOAD_MB + sum(
            MEMORY_PER_UPLOAD_MB_EXECUTORCH
            if target == "executorch"
            else MEMORY_PER_UPLOAD_MB_PER_TARGET
            for target in options.targets
        )
        wanted = max(DEFAULT_MEMORY_MB, per_mb * upload_mb + MEMORY_BASE_MB)
        options = options.model_copy(
            update={"memory_mb": min(wanted, max(settings.max_memory_mb, 256))}
        )
    disk = min(
        max(settings.disk_mb, DISK_PER_UPLOAD_MB * upload_mb),
        max(settings.max_disk_mb, settings.disk_mb),
    )
    if disk > settings.disk_mb:
        settings = settings.model_copy(
            update={"disk_mb": disk, "fsize_mb": max(settings.fsize_mb, disk)}
        )
    widest = min(FSIZE_PER_UPLOAD_MB * upload_mb, settings.disk_mb)
    if widest > settings.fsize_mb:
        settings = settings.model_copy(update={"fsize_mb": widest})
    return options, settings


def job_limits(
    options: ExportOptions,
    settings: SandboxSettings,
    baseline_mb: int,
    gpu_job: bool = False,
    mapped_bytes: int = 0,
) -> tuple[dict[str, Any], float, int]:
    """The job child's rlimits (sent to the zygote), its wall-clock timeout and its memory
    limit in MiB: the job's own, capped by the worker's (`max_timeout_s`, `max_memory_mb`);
    the one place they are capped.

    `mapped_bytes` (the model upload's size) is added to RLIMIT_DATA: the job maps a
    checkpoint zip's weights copy-on-write (private and writable, so the kernel counts the
    whole mapping there, touched or not), and what it reads of them is resident memory
    the watchdog counts against `memory_mb` like any other."""
    timeout = job_timeout(options, settings)
    wanted = DEFAULT_MEMORY_MB if options.memory_mb is None else options.memory_mb
    memory = min(wanted, settings.max_memory_mb)
    cpu = settings.cpu_s or int(timeout * (os.cpu_count() or 1)) + 10
    margin = settings.gpu_data_margin_mb if gpu_job else 0
    limits: dict[str, Any] = {
        # RLIMIT_DATA counts what the child inherited from the zygote, too.
        "memory_mb": memory + baseline_mb + margin + -(-mapped_bytes // (1 << 20)),
        "cpu_s": cpu,
        "fsize_mb": min(settings.fsize_mb, settings.disk_mb),
        "nofile": settings.nofile,
        "nproc": settings.nproc,
    }
    return limits, timeout, memory


def job_timeout(options: ExportOptions, settings: SandboxSettings) -> float:
    """The job's wall-clock limit: its `timeout_s`, capped by the worker's `max_timeout_s`
    (the job child is told it too: its targets' budgets share what it leaves)."""
    return min(float(options.timeout_s), settings.max_timeout_s)


def supervise(
    zygote: ZygoteClient,
    job_id: str,
    watch: Watch,
    timeout: float,
    memory_bytes: int,
    cancel: threading.Event | None,
    staging: Path,
    settings: SandboxSettings,
    on_done: Callable[[], None] = lambda: None,
) -> tuple[str | None, dict[str, Any]]:
    """Wait for the job; kill its processes on timeout, memory, disk or cancel.
    `on_done` runs when the child says its outputs are written, while it exits. When
    that took them (`watch.accepted`), the job is stopped and this returns without
    waiting for its exit (~10 ms for a transformer block: its address space torn down),
    with `{"after_done": True}`: the caller then waits for the exit with `await_exit`.

    Memory is checked twice: the job child's resident size on every turn (50 ms), and
    the whole tree's (tree.py: loaders, toolchain children and what they started) with
    the disk every `disk_check_interval_s`."""
    deadline = time.monotonic() + timeout
    tree = watch.tree
    verdict: str | None = None
    next_disk_check = 0.0
    while True:
        try:
            message = watch.messages.get(timeout=0.05)
        except queue.Empty:
            message = None
        if message is not None:
            op = message.get("op")
            if op == "started":
                tree.main = zygote.inner_to_outer(int(message["pid"]))
                if tree.main is not None:
                    tree.leaders.add(tree.main)
                watch.spare = bool(message.get("spare"))
                watch.prefault = bool(message.get("prefault"))
                # A spare's warm-up left it this much more resident than the zygote.
                memory_bytes += max(0, int(message.get("extra_rss_mb") or 0)) << 20
            elif op == "exited":
                _take_roundtrips(message, watch)
                exit_info = {"code": message.get("code"), "signal": message.get("signal")}
                if message.get("killed_for"):
                    exit_info["killed_for"] = str(message["killed_for"])[:200]
                return verdict, exit_info
            elif op == "dead":
                return verdict or "zygote_died", {}
            elif op == "helper":  # a loader or toolchain child of the job
                helper = zygote.inner_to_outer(int(message["pid"]))
                if helper is not None:
                    tree.leaders.add(helper)
            elif op == "quiet":  # forking spares leaves the job's busy stages alone
                with contextlib.suppress(OSError):
                    zygote.send({"op": "quiet", "id": job_id})
            elif op == "done" and verdict is None:
                on_done()
                if watch.accepted is not None:
                    with contextlib.suppress(OSError):
                        zygote.send({"op": "finish", "id": job_id})
            elif op == "finishing" and verdict is None:
                _take_roundtrips(message, watch)
                return None, {"code": None, "signal": None, "after_done": True}
            continue
        if verdict is None:
            if cancel is not None and cancel.is_set():
                verdict = "canceled"
            elif time.monotonic() > deadline:
                verdict = "timeout"
            elif tree.main is not None and read_rss(tree.main) > memory_bytes:
                verdict = "out_of_memory"
            elif time.monotonic() >= next_disk_check:
                next_disk_check = time.monotonic() + settings.disk_check_interval_s
                members = tree.members()
                held = tree.memory(members)
                watch.tree_peak = max(watch.tree_peak, held)
                if held > memory_bytes:
                    verdict = "out_of_memory"
                elif measure_disk(staging, members, watch, settings):
                    verdict = "disk_quota_exceeded"
            if verdict is not None:
                kill_job(zygote, job_id, tree)
                deadline = time.monotonic() + settings.kill_grace_s
        elif time.monotonic() > deadline:
            # The zygote did not confirm the kill: it is wedged, so replace it.
            zygote.stop()
            return verdict, {}


def _take_roundtrips(message: dict[str, Any], watch: Watch) -> None:
    """The zygote's round-trip counts for the job (`exited` or `finishing`)."""
    trips = message.get("roundtrips")
    if isinstance(trips, dict):
        watch.roundtrips = {str(k): int(v) for k, v in trips.items()}


def await_exit(zygote: ZygoteClient, job_id: str, watch: Watch, settings: SandboxSettings) -> None:
    """After `supervise` returned at `finishing`: wait until the zygote says the job's
    processes are gone (`exited`), replacing a zygote that does not say so in time."""
    deadline = time.monotonic() + settings.kill_grace_s
    while (left := deadline - time.monotonic()) > 0:
        try:
            message = watch.messages.get(timeout=left)
        except queue.Empty:
            break
        if message.get("op") in ("exited", "dead"):
            return
    zygote.stop()


def measure_disk(staging: Path, pids: list[int], watch: Watch, settings: SandboxSettings) -> bool:
    """Measure the job's disk use (quota.py; the deleted files each of `pids` holds open
    count too); keep the largest in `watch.disk`. True when it is over the quota."""
    limit = settings.disk_mb << 20
    use = quota.measure(staging, pids, limit, settings.max_inodes)
    watch.disk = use if watch.disk is None else watch.disk.peak(use)
    return use.over(limit, settings.max_inodes)


def kill_job(zygote: ZygoteClient, job_id: str, tree: JobTree) -> None:
    """Kill the job's process groups (those whose leaders are known: the job child, its
    loaders and toolchain children) and ask the zygote to."""
    for leader in tree.leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
    with contextlib.suppress(OSError):
        zygote.send({"op": "kill", "id": job_id})
