"""Profiles of a job's artifacts on the worker (option `profile`, `report.profile`).

Each artifact is loaded as a deployment would load it — `program.pt2` with
`torch.export.load(...).module()`, a target through its runtime's `load` — in the job's
own process (the sandbox's job child: no trusted process ever loads what a job wrote),
then run on the example inputs: `warmup` untimed runs, then up to `runs` timed ones, at one
thread and at the worker's thread count (the job's torch intra-op threads; ONNX Runtime's
and ExecuTorch's own pools set to the same count, `Subject.settings`). The eager model
(the reference, already in memory) is run the same way. Only the call is timed: inputs are
copied before it, outside the clock; a runtime's own conversions (ONNX Runtime's torch ↔
numpy) are part of its runner and timed.

Time: the profiles share a budget (`budget`): each measurement (an artifact at a thread
count) gets an equal share of what is left when it starts, its load and warm-up included;
it makes the first warm-up run and the first timed run whatever its share, and the others
while its share lasts, up to `warmup` and `runs`.

Memory: the peak of the process's resident set while an artifact is loaded and run
(`engine.profile.resident_memory.PeakWatch`: the kernel's high-water mark `VmHWM`, reset at the
start where allowed, else the resident set sampled every `INTERVAL_S`); it is in
the one process that also holds the model and the programs (`added_rss_mb` is the part an
artifact added). An artifact whose files would not fit in what is left of `memory_mb` is not
loaded (`status` `skipped`): a profile never ends a job that succeeded.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.profile import resident_memory
from schemas import ExportOptions, ProfileOptions
from schemas.profile import (
    ArtifactProfile,
    DecodeLatency,
    LatencyProfile,
    MachineProfile,
    ProfiledKind,
    ProfileReport,
)

__all__ = [
    "INTERVAL_S",
    "Subject",
    "budget",
    "decoding",
    "eager_subject",
    "machine",
    "profile",
    "program_subject",
    "target_subject",
    "wanted",
]

Runner = Callable[[tuple[Any, ...], dict[str, Any]], Any]

INTERVAL_S = resident_memory.INTERVAL_S
"""How often the resident set is sampled while an artifact runs (where the kernel's
high-water mark cannot be reset: `engine.profile.resident_memory`)."""

LOAD_MEMORY_FACTOR = 2.0
"""An artifact is loaded only when this many times its size on disk fits in what is left of
the job's memory limit (a load holds the file's weights, and often a copy while reading)."""


@dataclass(frozen=True)
class Subject:
    """One artifact to profile: how to load it at a thread count, and its inputs."""

    name: str
    kind: ProfiledKind
    runtime: str
    load: Callable[[int], Runner]
    """Loads the artifact with its runtime's threads set to the count given."""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    files: list[Path] = field(default_factory=list)
    settings: tuple[str, ...] = ()
    """The runtime's own thread settings `load` sets, besides `torch.set_num_threads`."""
    decode_positions: tuple[int, ...] = ()
    """For a generation-ready LLM's artifact whose cache is program state: the cache
    positions a one-token decode step is timed at (`decoding`)."""


def decoding(subject: Subject, max_cache_len: int, prompt: torch.Tensor | None = None) -> Subject:
    """`subject` with one-token decode steps to time at a short and a long cache position
    (an eighth, at most 64, and seven eighths of `max_cache_len`), when it takes
    `input_ids` and `cache_position` by name (a program with its cache as state), or its
    past as inputs (`input_ids`, `attention_mask`, `past_key_values`: an ONNX model); the
    latter's timed runs become the prefill of `prompt` with an empty past."""
    kwargs = subject.kwargs
    state = {"input_ids", "cache_position"} <= set(kwargs)
    past = prompt is not None and {"input_ids", "attention_mask", "past_key_values"} <= set(kwargs)
    if not state and not past:
        return subject
    positions = sorted({min(64, max_cache_len // 8), max_cache_len - max_cache_len // 8})
    positions = [p for p in positions if 0 < p < max_cache_len]
    if past:
        assert prompt is not None
        kwargs = _with_past(kwargs, prompt, 0)
    return dataclasses.replace(subject, kwargs=kwargs, decode_positions=tuple(positions))


def _step(subject: Subject, position: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The inputs of one decode step at `position`: the example's first token there (for
    a model taking its past as inputs, after a past of `position` zeros)."""
    args, kwargs = _copied(subject)
    ids = kwargs["input_ids"][..., :1].clone()
    if "cache_position" not in kwargs:
        return args, _with_past(kwargs, ids, position)
    kwargs["input_ids"] = ids
    kwargs["cache_position"] = torch.tensor([position], dtype=kwargs["cache_position"].dtype)
    return args, kwargs


def _with_past(kwargs: dict[str, Any], ids: torch.Tensor, past: int) -> dict[str, Any]:
    """An ONNX past-form model's inputs (`generation.onnx_past`), in `kwargs`' order and
    dtypes: `ids` after a past of `past` zeros."""
    batch, new = ids.shape[0], ids.shape[-1]
    made: dict[str, Any] = {}
    for name, value in kwargs.items():
        if name == "input_ids":
            made[name] = ids.to(value.dtype)
        elif name == "attention_mask":
            made[name] = torch.ones(batch, past + new, dtype=value.dtype)
        elif name == "position_ids":
            made[name] = torch.arange(past, past + new, dtype=value.dtype).repeat(batch, 1)
        elif name == "past_key_values":
            made[name] = [
                tuple(
                    torch.zeros(batch, each.shape[1], past, each.shape[3], dtype=each.dtype)
                    for each in layer
                )
                for layer in value
            ]
        else:
            made[name] = value
    return made


def wanted(options: ExportOptions) -> bool:
    """Whether the job profiles its artifacts: `profile.enabled`, or when that is null,
    whether it asked for targets."""
    enabled = options.profile.enabled
    return bool(options.targets) if enabled is None else enabled


def budget(options: ExportOptions, elapsed_s: float) -> float:
    """The profiles' time: `profile.budget_s`, at most half of what `timeout_s` leaves after
    `elapsed_s` (the job has yet to write its report and hand its files over)."""
    return max(0.0, min(options.profile.budget_s, (options.timeout_s - elapsed_s) / 2))


def eager_subject(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Subject:
    """The model as uploaded, already in memory: the reference row."""

    def load(threads: int) -> Runner:
        return lambda a, k: module(*a, **k)

    return Subject("eager", "eager", f"torch {torch.__version__}, eager", load, args, kwargs)


def program_subject(path: Path, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Subject:
    """`program.pt2` loaded as a deployment would: `torch.export.load(path).module()`."""

    def load(threads: int) -> Runner:
        module = torch.export.load(path).module()
        return lambda a, k: module(*a, **k)

    return Subject(
        "program",
        "program",
        f"torch {torch.__version__}, torch.export.load(...).module()",
        load,
        args,
        kwargs,
        [path],
    )


def target_subject(
    name: str,
    target: Any,
    path: Path,
    source: torch.export.ExportedProgram,
    loading: dict[str, Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    files: Sequence[Path],
) -> Subject:
    """A deployment target's artifact, loaded by its module `target` (`engine.targets.*`)
    as its verification loaded it (`loading`: the names and settings `load` takes), run on
    the inputs it was verified on."""
    load = functools.partial(target.load, path, source, **loading)
    return Subject(
        name,
        "target",
        target.runtime(),
        lambda threads: load(threads=threads),
        args,
        kwargs,
        [each for each in files if each.exists()],
        tuple(target.THREAD_SETTINGS),
    )


def profile(
    subjects: Sequence[Subject],
    options: ProfileOptions,
    *,
    budget_s: float,
    device: str = "cpu",
    memory_mb: int | None = None,
    progress: Callable[[float, str], None] | None = None,
) -> ProfileReport:
    """Profile each subject in turn at 1 thread and at the worker's thread count.

    Never raises for an artifact: one that fails to load or run has `status` `failed`.
    `memory_mb` is the job's memory limit (an artifact that would not fit is `skipped`).
    """
    started = time.perf_counter()
    worker = torch.get_num_threads()
    counts = sorted({1, worker})
    left = len(subjects) * len(counts)

    def share() -> float:
        nonlocal left
        remaining = budget_s - (time.perf_counter() - started)
        left = max(1, left)
        granted = max(0.0, remaining) / left
        left -= 1
        return granted

    profiles = []
    for index, subject in enumerate(subjects):
        if progress is not None:
            progress(index / max(1, len(subjects)), f"{subject.name}: {subject.runtime}")
        profiles.append(_artifact(subject, counts, options, share, device, memory_mb))
    return ProfileReport(
        machine=machine(device),
        runs=options.runs,
        warmup=options.warmup,
        budget_s=round(budget_s, 3),
        duration_s=time.perf_counter() - started,
        artifacts=profiles,
    )


def _artifact(
    subject: Subject,
    counts: list[int],
    options: ProfileOptions,
    share: Callable[[], float],
    device: str,
    memory_mb: int | None,
) -> ArtifactProfile:
    present = [each for each in subject.files if each.exists()]
    size = sum(each.stat().st_size for each in present) if subject.files else None
    found = ArtifactProfile(
        name=subject.name,
        kind=subject.kind,
        artifact=subject.files[0].name if subject.files else None,
        files=[each.name for each in subject.files],
        size=size,
        runtime=subject.runtime,
    )
    headroom = _headroom_mb(memory_mb)
    if size is not None and headroom is not None and size * LOAD_MEMORY_FACTOR / 2**20 > headroom:
        for _ in counts:
            share()
        found.status = "skipped"
        found.error = (
            f"not loaded: {size / 2**20:.0f} MB on disk, {headroom:.0f} MB left under the "
            "job's memory limit"
        )
        return found
    worker = torch.get_num_threads()
    peaks = resident_memory.PeakWatch().start()
    try:
        for threads in counts:
            found.latency.append(_timed(subject, threads, options, share(), device))
        found.load_s = found.latency[-1].load_s
    except Exception as exc:  # a runtime that fails here fails only its profile
        for _ in range(len(counts) - len(found.latency) - 1):
            share()  # the shares it will not use go to the next artifacts
        found.status = "failed"
        found.latency = []
        lines = str(exc).strip().splitlines()
        found.error = f"{type(exc).__name__}: {lines[0][:500] if lines else ''}".rstrip(": ")
    finally:
        torch.set_num_threads(worker)
        gc.collect()
        found.peak_rss_mb, found.added_rss_mb = peaks.stop()
        # the next artifact's `added_rss_mb` starts from what is really in use
        resident_memory.release_free_memory()
    return found


def _timed(
    subject: Subject, threads: int, options: ProfileOptions, share_s: float, device: str
) -> LatencyProfile:
    started = time.perf_counter()
    deadline = started + share_s
    torch.set_num_threads(threads)
    settings = {"torch.set_num_threads": threads, **dict.fromkeys(subject.settings, threads)}
    runner = subject.load(threads)
    load_s = None if subject.kind == "eager" else time.perf_counter() - started
    sync = torch.cuda.synchronize if device == "cuda" else _nothing
    warmed = 0
    with torch.no_grad():
        while warmed < options.warmup and (not warmed or time.perf_counter() < deadline):
            runner(*_copied(subject))
            warmed += 1
        sync()
        times = _timed_runs(runner, lambda: _copied(subject), options.runs, deadline, sync)
        decode = [
            _decode_steps(subject, runner, position, options.runs, deadline, sync)
            for position in subject.decode_positions
        ]
    del runner
    ordered = sorted(times)
    return LatencyProfile(
        decode=decode,
        threads=threads,
        settings=settings,
        load_s=load_s,
        warmup=warmed,
        runs=len(times),
        budget_reached=len(times) < options.runs,
        p50_ms=statistics.median(ordered),
        p90_ms=ordered[math.ceil(0.9 * len(ordered)) - 1],
        mean_ms=statistics.fmean(ordered),
        min_ms=ordered[0],
        max_ms=ordered[-1],
    )


def _decode_steps(
    subject: Subject,
    runner: Runner,
    position: int,
    runs: int,
    deadline: float,
    sync: Callable[[], None],
) -> DecodeLatency:
    """One untimed step at `position`, then up to `runs` timed ones while the share
    lasts (the first whatever it is)."""
    runner(*_step(subject, position))
    times = _timed_runs(runner, lambda: _step(subject, position), runs, deadline, sync)
    return DecodeLatency(
        position=position,
        runs=len(times),
        p50_ms=statistics.median(times),
        mean_ms=statistics.fmean(times),
        min_ms=min(times),
        max_ms=max(times),
    )


def _timed_runs(
    runner: Runner,
    inputs: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]],
    runs: int,
    deadline: float,
    sync: Callable[[], None],
) -> list[float]:
    """Up to `runs` calls of `runner` on fresh `inputs()` while `deadline` is ahead (the
    first whatever it is): each call's milliseconds, the inputs made outside the clock."""
    times: list[float] = []
    while len(times) < runs and (not times or time.perf_counter() < deadline):
        args, kwargs = inputs()
        began = time.perf_counter_ns()
        runner(args, kwargs)
        sync()
        times.append((time.perf_counter_ns() - began) / 1e6)
    return times


def _copied(subject: Subject) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Fresh inputs for one run: a model may write its inputs in place."""
    return copy.deepcopy((tuple(subject.args), dict(subject.kwargs)))


def _nothing() -> None:
    return None


_ISA_FLAGS = (
    # x86-64: what torch's, ONNX Runtime's and XNNPACK's kernels choose between
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx_vnni",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_int8",
    "amx_bf16",
    # Arm
    "asimd",
    "asimdhp",
    "asimddp",
    "i8mm",
    "bf16",
    "sve",
    "sve2",
)


def machine(device: str = "cpu") -> MachineProfile:
    """The worker's CPU model, the vector ISAs it reports and the thread counts."""
    cpu, flags = _cpuinfo()
    try:
        capability: str | None = str(torch.backends.cpu.get_cpu_capability())
    except Exception:
        capability = None
    try:
        cpus: int | None = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count()
    return MachineProfile(
        cpu=cpu,
        architecture=platform.machine(),
        isa=[flag for flag in _ISA_FLAGS if flag in flags],
        torch_capability=capability,
        threads=torch.get_num_threads(),
        cpus=cpus,
        device=device,
    )


@functools.cache
def _cpuinfo() -> tuple[str | None, frozenset[str]]:
    """The CPU's model name and flags from /proc/cpuinfo (its first processor)."""
    name: str | None = None
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and name is None:
                    name = value.strip() or None
                elif key in ("flags", "features") and not flags:
                    flags = set(value.split())
                elif not line.strip() and name is not None and flags:
                    break
    except OSError:
        pass
    return name or platform.processor() or None, frozenset(flags)


def _headroom_mb(memory_mb: int | None) -> float | None:
    """MB left under the job's memory limit (`memory_mb`, or RLIMIT_DATA when lower)."""
    limits = [memory_mb * 2**20] if memory_mb else []
    data, _ = resource.getrlimit(resource.RLIMIT_DATA)
    if data != resource.RLIM_INFINITY:
        limits.append(data)
    now = resident_memory.resident()
    if not limits or now is None:
        return None
    return (min(limits) - now) / 2**20
