"""The zygote's warm-up: what it runs before it forks, so that every child inherits
torch's lazy imports and caches instead of paying for them per job.

- `warm_zygote`: torch and the engine imported with one thread, the warm-up run, the
  model libraries imported (warm_libraries.py), the heap frozen; refused when a thread
  was left behind (threads.py).
- `warm_full_pipeline`: the whole pipeline once on a tiny transformer block (the
  zygote, a job spare; benchmarks call it to put a process in the zygote's state).
- `warm_spare`, `warm_loader`: a spare's own warm-up; the loader's, for one-shot runs.
- `cuda_hidden`: torch sees no CUDA during the warm-up, so no child is "bad fork".
- `collapse_heap`: the zygote's heap in transparent huge pages (cheaper forks).

torch and the engine are imported inside the functions, never at import time: the
zygote imports this module before torch, in the order zygote.py sets.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from worker.sandbox.child import run as child
from worker.sandbox.processes import read_status_kb
from worker.sandbox.zygote import threads
from worker.sandbox.zygote.warm_libraries import WarmedLibraries, wanted_libraries, warm_libraries

__all__ = [
    "HUGE_PAGE",
    "MADV_COLLAPSE",
    "WARM_PAYLOAD",
    "WARM_PROGRAM",
    "collapse_heap",
    "cuda_hidden",
    "probe_bad_fork",
    "warm_full_pipeline",
    "warm_loader",
    "warm_spare",
    "warm_zygote",
]

WARM_PROGRAM = ("out", "program.pt2")
WARM_PAYLOAD = ("work", "roundtrip-payload.pt")
"""What `warm_full_pipeline` leaves in its directory for a loader spare's warm-up."""

_WARM_MODEL = """
import torch
model = torch.nn.TransformerEncoderLayer(
    d_model=8, nhead=2, dim_feedforward=16, batch_first=True, dropout=0.0
).eval()
example_args = (torch.randn(1, 3, 8),)
"""


def warm_full_pipeline(warm: Path) -> None:
    """Run the whole pipeline once (attention, decomposition tables, verification, the
    save and the load of the round trip) on tiny shapes, so that children inherit every
    lazy import and cache. Tiny shapes never enter a parallel region, so torch's
    intra-op thread pool is not started (tests prove forked children never hang)."""
    from engine.load.model import Upload
    from engine.pipeline import export as pipeline
    from engine.serialize import roundtrip
    from schemas import ExportOptions

    source = warm / "warm_model.py"
    source.write_text(_WARM_MODEL)

    pipeline.run_export(
        pipeline.ExportRequest(
            upload=Upload(model=source),
            options=ExportOptions(),
            out_dir=warm / "out",
            work_dir=warm / "work",
        ),
        roundtrip_runner=lambda pt2, payload: roundtrip.run_in_process(pt2, payload, "zygote"),
    )


def warm_spare(kind: str, warm: Path) -> None:
    """A spare's own warm-up, in its own address space: the whole pipeline once more for
    a job spare, the load and run of the zygote's warm-up program for a loader spare."""
    import torch

    with cuda_hidden(torch):
        if kind == "job":
            scratch = warm / f"spare-{os.getpid()}"
            scratch.mkdir()
            try:
                warm_full_pipeline(scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
        else:
            child.check_roundtrip(
                str(warm.joinpath(*WARM_PROGRAM)), str(warm.joinpath(*WARM_PAYLOAD))
            )


def warm_zygote(config: dict[str, Any]) -> tuple[Any, list[str], int, WarmedLibraries]:
    """In the zygote, after seccomp is prepared: quiet the libraries that start threads,
    import torch (one intra-op thread) and the engine, run the warm-up and import the
    model libraries (warm_libraries.py) unless the config's `warm_up` says otherwise,
    freeze the heap and collapse it into huge pages. Returns torch, the libraries
    quieted, the MB in huge pages and the model libraries warmed; refuses to go on
    (SystemExit, naming it) when the warm-up left a thread behind."""
    quieted = threads.quiet_libraries()
    import torch

    # A forked child of a process whose intra-op pool ever ran hangs forever. With one
    # thread, parallel_for runs inline and the pool is never started; each child sets
    # its own thread count (child.run_export_job) and starts a fresh pool if it needs one.
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    threads_before = threads.task_ids()  # `import torch` starts one of its own
    libraries = WarmedLibraries()
    with cuda_hidden(torch):
        import schemas.version  # noqa: F401  (reads the version from installed metadata once)
        from engine.environment import machine as environment
        from engine.pipeline import export as pipeline

        environment.describe("cpu")

        if config.get("warm_up", True) is True:
            # Libraries first: their imports register op namespaces (transformers brings
            # torchao, torch.distributed's, onnx's) that every decomposition walks; the
            # warm-up then materializes their ops here, once, not in each child.
            libraries = warm_libraries(wanted_libraries(config))
            warm = Path(config["warm_dir"])
            pipeline.warm_up(warm)
            warm_full_pipeline(warm)
    started_threads = threads.started_since(threads_before)
    if started_threads:
        raise SystemExit(threads.refusal(started_threads))
    # Everything alive now is shared with every child. Freezing it keeps the
    # children's collector from walking (and so copying on write) the whole heap.
    gc.collect()
    gc.freeze()
    huge_mb = collapse_heap()
    return torch, quieted, huge_mb, libraries


def warm_loader(warm: Path) -> None:
    """One-shot runs (zygote `warm_up: during_first_job`): while the job just forked
    traces (on another core), save, load and run a tiny program in the zygote, so the
    loader forked for its round trip starts warm (~1.8 s cold on this machine's tiny
    transformer). Requests wait meanwhile. Refuses (SystemExit) to leave a thread."""
    import torch

    from engine.pipeline import export as pipeline
    from engine.serialize import roundtrip

    before = threads.task_ids()
    with cuda_hidden(torch):
        pipeline.warm_up(warm)
        loaded = roundtrip.load_saved(warm / "warm-up.pt2")
        if loaded.module is not None:
            loaded.module(torch.zeros(2, 2))
    started_threads = threads.started_since(before)
    if started_threads:
        raise SystemExit(threads.refusal(started_threads))


_GUARD = "_ensureCUDADeviceGuardSet"
"""What a fake-tensor mode calls when it sees no CUDA; it asks the driver (cuda_hidden)."""


@contextlib.contextmanager
def cuda_hidden(torch: Any) -> Iterator[None]:
    """Make `torch.cuda.is_available()` False (and `device_count()` 0) without asking the
    driver, for the zygote's warm-up.

    torch.export asks `is_available()` on every fake-tensor mode it enters and, in
    `preserve_rng_state`, reads the CUDA RNG state when it says yes. The first calls
    `cudaGetDeviceCount`, which initializes the driver and marks every later fork "bad"
    (torch then refuses CUDA there: "Cannot re-initialize CUDA in forked subprocess");
    the second creates a CUDA context. Either would leave no job child able to use the
    GPU. The warm-up runs on the CPU, so the answer it sees changes nothing it caches.

    Hiding CUDA has a catch of its own: a fake-tensor mode that sees no CUDA calls
    `torch._C._ensureCUDADeviceGuardSet()` on entering, to put a no-op guard in place of
    a missing CUDA one, and on a CUDA build that asks the driver for its device count:
    `cuInit`, and the driver's own thread (`cuda0000…`) in the zygote. Measured on an
    H100 worker (torch 2.11+cu130): every zygote refused to start, and every one-shot
    `torchport export` died at its first job. A CUDA build has its guard already, so
    the call is skipped while hidden; a CPU-only build's fake modes trace nothing on
    CUDA in the warm-up either.
    """
    cuda = torch.cuda
    saved = (cuda.is_available, cuda.device_count)
    guard = getattr(torch._C, _GUARD, None)
    cuda.is_available, cuda.device_count = (lambda: False), (lambda: 0)
    if guard is not None:
        setattr(torch._C, _GUARD, lambda: None)
    try:
        yield
    finally:
        cuda.is_available, cuda.device_count = saved
        if guard is not None:
            setattr(torch._C, _GUARD, guard)


def probe_bad_fork(torch: Any) -> bool:
    """Whether torch would refuse CUDA in a child forked now (a throw-away fork asks)."""
    in_bad_fork = getattr(torch._C, "_cuda_isInBadFork", None)
    if in_bad_fork is None:  # a CPU-only build of torch
        return False
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os._exit(1 if in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


MADV_COLLAPSE = 25
HUGE_PAGE = 1 << 21


def collapse_heap() -> int:
    """Back the zygote's anonymous memory with transparent huge pages (MADV_COLLAPSE,
    Linux 6.1+); returns the MB now in huge pages (0 where the kernel cannot).

    fork() copies, and exit() tears down, one page-table entry per 4 KiB page of
    anonymous memory: for a zygote holding ~270 MB of Python and torch heap, about
    12 ms each per job. In 2 MiB pages both take a few ms. A child's first write to a
    shared huge page still copies only that 4 KiB page (the kernel splits the mapping
    in the child), so children do not grow; the zygote's resident size barely changes.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    try:
        with open("/proc/self/maps") as handle:
            maps = handle.read().splitlines()
    except OSError:
        return 0
    for line in maps:
        fields = line.split()
        name = fields[5] if len(fields) > 5 else ""
        if name not in ("", "[heap]") or not fields[1].startswith("rw"):
            continue
        start, end = (int(x, 16) for x in fields[0].split("-"))
        start = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        end &= ~(HUGE_PAGE - 1)
        if end - start < HUGE_PAGE:
            continue
        failed = libc.madvise(start, end - start, MADV_COLLAPSE) != 0
        if failed and ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):  # no MADV_COLLAPSE
            break
    return read_status_kb("AnonHugePages", "/proc/self/smaps_rollup") // 1024
