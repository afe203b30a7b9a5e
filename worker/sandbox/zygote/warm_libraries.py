"""Model libraries the zygote imports before it forks (setting `warm_libraries`), so that
a job using one pays only for its own model's modules, not for the library's import.

Each library is imported first in a throw-away fork of the zygote, a *probe*: a library
whose import fails, starts a thread or does not finish in `PROBE_TIMEOUT_S` is skipped
(named in the zygote's log and its `hello`), never fatal. A thread started in the
zygote itself would be missing from every child forked after it (threads.py), and an
import the zygote could not finish would leave it half-initialised. After a skip the
rest are probed again in a fresh fork, without it: a library that imports a skipped
one (peft imports transformers) is judged as the zygote would import it. Then the
zygote imports those that passed; warmup.py's check that no thread was left behind
still covers them.

Jobs still see each library as it was right after its import: a job is a fork, so
whatever one job changes (a patched function, a registered class) is its own copy and
gone when it exits. No job gains a right: the libraries' files are among the code a
job may read anyway (lockdown.code_paths).

Not in a GPU worker's zygote: its warm-up hides CUDA (warmup.cuda_hidden), and a library
may cache what it saw at import (transformers' `is_flash_attn_2_available` keeps the
answer of `is_torch_cuda_available` in an `lru_cache`), which its CUDA jobs would inherit.

What is imported per library: transformers and diffusers import lazily (`import
transformers` is cheap; a model class loads its modeling module, and that the heavy
common ones), so their entries name the modules a job's load actually spends its time
in (measured with `python -X importtime` on a tiny BERT and Llama, docs/sandbox.md).
A name not known here is imported as the module it names.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import json
import os
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from worker.sandbox.zygote import threads

__all__ = [
    "DEFAULT_LIBRARIES",
    "MODULES",
    "PROBE_TIMEOUT_S",
    "WarmedLibraries",
    "default_libraries",
    "wanted_libraries",
    "warm_libraries",
]

DEFAULT_LIBRARIES = ("transformers", "diffusers", "peft", "timm", "torchvision")
"""The `models` extra's libraries and the two the worker image adds (Dockerfile): the
default of `warm_libraries` is those of them that are installed."""

_ARCHITECTURES: tuple[str, ...] = ("bert", "distilbert", "roberta", "gpt2", "llama", "mistral")
_ARCHITECTURES += ("qwen2", "t5", "vit", "clip", "whisper")

MODULES: dict[str, tuple[str, ...]] = {
    "transformers": (
        "transformers",
        "transformers.modeling_utils",
        "transformers.models.auto.modeling_auto",
        "transformers.models.auto.configuration_auto",
        "transformers.integrations.executorch",
        *(f"transformers.models.{name}.modeling_{name}" for name in _ARCHITECTURES),
    ),
    "diffusers": (
        "diffusers",
        "diffusers.models.modeling_utils",
        "diffusers.models.autoencoders.autoencoder_kl",
        "diffusers.models.unets.unet_2d_condition",
        "diffusers.models.unets.unet_2d",
    ),
    "peft": ("peft",),
    "timm": ("timm", "timm.models"),
    "torchvision": ("torchvision", "torchvision.models", "torchvision.ops"),
}
"""Per library, the modules imported to warm it."""

PROBE_TIMEOUT_S = 120.0
"""How long the probes of all libraries together may take."""


@dataclass
class WarmedLibraries:
    """What the zygote warmed, and why it skipped the rest."""

    imported: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    """Probes and imports together."""

    def to_json(self) -> dict[str, object]:
        return {
            "imported": self.imported,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 3),
        }


def default_libraries() -> list[str]:
    """The libraries of `DEFAULT_LIBRARIES` installed for this interpreter."""
    return [name for name in DEFAULT_LIBRARIES if importlib.util.find_spec(name) is not None]


def wanted_libraries(config: dict[str, Any]) -> list[str]:
    """The libraries a zygote with this `config` warms: none on a GPU worker or without
    the warm-up, else the setting's (`default_libraries()` when it names none)."""
    if config.get("gpu") or config.get("warm_up", True) is not True:
        return []
    names = config.get("warm_libraries")
    return default_libraries() if names is None else [str(name) for name in names]


def warm_libraries(names: list[str] | None, timeout_s: float = PROBE_TIMEOUT_S) -> WarmedLibraries:
    """Import the libraries `names` (None: `default_libraries()`) that a probe imported
    cleanly; in the zygote, with one torch thread, before it forks."""
    started = time.perf_counter()
    result = WarmedLibraries()
    wanted = default_libraries() if names is None else list(dict.fromkeys(names))
    deadline = time.monotonic() + timeout_s
    passed: list[str] = []
    pending = wanted
    while pending:
        if time.monotonic() >= deadline:
            result.skipped.update({name: "not probed: time ran out" for name in pending})
            break
        verdicts = _probe(pending, deadline)
        for name in pending:
            if name not in verdicts:
                break
            why = verdicts[name]
            if why is not None:
                result.skipped[name] = why
                break
            passed.append(name)
        pending = [n for n in pending if n not in passed and n not in result.skipped]
    for name in passed:
        try:
            _import(name)
        except Exception as exc:  # the probe imported it: it should not fail here
            result.skipped[name] = _describe(exc)
            continue
        result.imported.append(name)
    for name, why in result.skipped.items():
        print(f"torchport zygote: not warming {name}: {why}", file=sys.stderr, flush=True)
    result.seconds = time.perf_counter() - started
    return result


def _import(name: str) -> None:
    for module in MODULES.get(name, (name,)):
        importlib.import_module(module)


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def _probe(names: list[str], deadline: float) -> dict[str, str | None]:
    """Import `names` in order in a fork, stopping at the first that fails or starts a
    thread; per library probed, None (clean) or why not. A library the probe was still
    importing at `deadline` is reported as too slow."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the probe
        os.close(read_end)
        try:
            _probe_child(names, write_end)
        finally:
            os._exit(0)
    os.close(write_end)
    verdicts: dict[str, str | None] = {}
    buffer = b""
    try:
        while True:
            left = deadline - time.monotonic()
            ready = select.select([read_end], [], [], max(0.0, left))[0] if left > 0 else []
            if not ready:
                current = next((n for n in names if n not in verdicts), None)
                if current is not None:
                    verdicts[current] = "its import did not finish in time"
                break
            chunk = os.read(read_end, 65536)
            if not chunk:
                current = next((n for n in names if n not in verdicts), None)
                if current is not None:
                    verdicts[current] = "the probe importing it died"
                break
            buffer += chunk
            *lines, buffer = buffer.split(b"\n")
            for line in lines:
                item = json.loads(line)
                verdicts[str(item["name"])] = item["why"]
    finally:
        os.close(read_end)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return verdicts


def _probe_child(names: list[str], out: int) -> None:  # pragma: no cover - the probe
    for name in names:
        before = threads.task_ids()
        why = None
        try:
            _import(name)
        except BaseException as exc:
            why = _describe(exc)
        started = threads.started_since(before)
        if why is None and started:
            why = "its import started threads: " + ", ".join(str(t) for t in started)
        os.write(out, json.dumps({"name": name, "why": why}).encode() + b"\n")
        if why is not None:
            return
