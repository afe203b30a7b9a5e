"""The save → load → run check, done the way a deployment loads a `.pt2`.

A deployment has torch and nothing of the user's code, so the saved program is loaded
in a fresh interpreter that imports only torch: `python -I -m engine.serialize.roundtrip PT2
PAYLOAD OUT_JSON`. The exporting process writes a payload (example inputs and the
outputs of the exported program, run there) with `write_payload`; the fresh process
loads both, runs the program and compares every output leaf bit for bit.

This module imports only the standard library, torch, `engine.serialize.serde_hints`
and `engine.serialize.mapped` (torch only) at top level, so the fresh process stays
torch-only; `schemas` is imported lazily by `run_in_subprocess`, which runs in the
exporting process. Loading gives torch's deserializer the schema's type hints once per
class (`serde_hints`): about half of a load's time otherwise.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.utils._pytree as pytree

from engine.serialize import serde_hints
from engine.serialize.mapped import Mapping, mapped_weights, run_releasing
from engine.verify.flat import flatten_with_paths

if TYPE_CHECKING:
    from schemas import RoundtripCheck

__all__ = [
    "LoadedProgram",
    "check_saved",
    "load_saved",
    "main",
    "run_in_subprocess",
    "run_loaded",
    "write_payload",
]

_PAYLOAD_VERSION = 2
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def write_payload(
    path: str | os.PathLike[str],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    expected_outputs: Any,
) -> None:
    """Save example inputs and the exported program's outputs for `check_saved`.

    `expected_outputs` are the outputs of `ep.module()` run in the exporting process,
    so the fresh process must reproduce them exactly. Only the leaves are stored (with
    the outputs' paths): the loading process rebuilds the inputs with the program's own
    input spec, so containers of the user's types never need unpickling and
    `torch.load(weights_only=True)` reads the file.
    """
    expected = flatten_with_paths(expected_outputs)[0]
    payload = {
        "version": _PAYLOAD_VERSION,
        "inputs": _detached(pytree.tree_leaves((tuple(args), dict(kwargs)))),
        "expected": _detached([leaf for _, leaf in expected]),
        "expected_paths": [path for path, _ in expected],
    }
    torch.save(payload, os.fspath(path))


def check_saved(
    pt2_path: str | os.PathLike[str], payload_path: str | os.PathLike[str]
) -> dict[str, Any]:
    """Load a saved program, run it on the payload's inputs, compare bit for bit.

    Returns a dict with the fields of `schemas.RoundtripCheck` (without `loader`).
    A failure to load or run is reported in the dict, never raised.
    """
    return run_loaded(load_saved(pt2_path), payload_path)


@dataclass
class LoadedProgram:
    """The first half of `check_saved`: the program loaded (or why it did not load)."""

    module: Any
    in_spec: Any
    failure: str | None
    duration_s: float
    mapping: Mapping | None = None
    """The mapping a big program's weights are views of (`mapped.run_releasing`)."""


def load_saved(pt2_path: str | os.PathLike[str]) -> LoadedProgram:
    """Load a saved program and build its module, before the payload exists: a loader
    that is handed the program early does this while the exporter writes the payload."""
    started = time.perf_counter()
    serde_hints.install()
    captured = _CapturedErrors()
    export_log = logging.getLogger("torch.export")
    export_log.addHandler(captured)
    try:
        with mapped_weights(pt2_path) as mapping:  # a big program's weights mapped, not read
            ep = torch.export.load(os.fspath(pt2_path))
    except Exception as exc:
        # torch.export.load logs the real cause and raises a generic RuntimeError.
        cause = captured.first or exc
        failure = f"load failed: {_describe(cause)}"
        return LoadedProgram(None, None, failure, time.perf_counter() - started)
    finally:
        export_log.removeHandler(captured)
    try:
        module = ep.module()
    except Exception as exc:
        failure = f"run failed: {_describe(exc)}"
        return LoadedProgram(None, None, failure, time.perf_counter() - started)
    spent = time.perf_counter() - started
    return LoadedProgram(module, ep.call_spec.in_spec, None, spent, mapping)


def run_loaded(loaded: LoadedProgram, payload_path: str | os.PathLike[str]) -> dict[str, Any]:
    """The second half of `check_saved`: run the loaded program on the payload's inputs
    and compare bit for bit. `duration_s` counts both halves, not the wait between."""
    started = time.perf_counter()

    def result(status: str, **fields: Any) -> dict[str, Any]:
        fields.setdefault("bitwise_equal", None)
        fields.setdefault("reason", None)
        fields.setdefault("outputs", [])
        duration = loaded.duration_s + time.perf_counter() - started
        return {"status": status, "duration_s": duration, **fields}

    try:
        payload = torch.load(os.fspath(payload_path), weights_only=True)
    except Exception as exc:
        return result("failed", reason=f"payload unreadable: {_describe(exc)}")
    if loaded.failure is not None:
        return result("failed", reason=loaded.failure)

    try:
        args, kwargs = pytree.tree_unflatten(payload["inputs"], loaded.in_spec)
        with torch.no_grad():
            if loaded.mapping is not None and isinstance(loaded.module, torch.fx.GraphModule):
                # one layer's weights resident at a time, beside the job that exported it
                actual = run_releasing(loaded.module, loaded.mapping, loaded.in_spec, args, kwargs)
            else:
                actual = loaded.module(*args, **kwargs)
    except Exception as exc:
        return result("failed", reason=f"run failed: {_describe(exc)}")

    outputs, structure_reason = _compare_bitwise(
        payload["expected_paths"], payload["expected"], actual
    )
    equal = structure_reason is None and all(o["passed"] for o in outputs)
    return result(
        "passed" if equal else "failed",
        bitwise_equal=equal,
        reason=structure_reason or (None if equal else "outputs differ after loading"),
        outputs=outputs,
    )


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.serialize.roundtrip PT2 PAYLOAD OUT_JSON`: write `check_saved`'s dict."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3:
        print("usage: python -m engine.serialize.roundtrip PT2 PAYLOAD OUT_JSON", file=sys.stderr)
        return 2
    pt2, payload, out = argv
    Path(out).write_text(json.dumps(check_saved(pt2, payload)))
    return 0


def run_in_process(
    pt2_path: Path, payload_path: Path, loader: str = "in-process"
) -> RoundtripCheck:
    """Run `check_saved` right here: for processes that are themselves torch-only (the
    sandbox zygote's warm-up) and for benchmarks of everything else."""
    from schemas import RoundtripCheck

    return RoundtripCheck.model_validate({**check_saved(pt2_path, payload_path), "loader": loader})


def run_in_subprocess(pt2_path: Path, payload_path: Path, timeout_s: float = 120) -> RoundtripCheck:
    """Run `check_saved` in a fresh, isolated interpreter that has imported only torch.

    `-I` ignores PYTHON* variables, the user site and the current directory; the
    environment is reduced to PATH/HOME/LANG and the working directory is a fresh
    temporary one, so no uploaded module can be imported by accident. `engine` itself
    is found as an installed package.
    """
    from schemas import RoundtripCheck

    started = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG")}
    with tempfile.TemporaryDirectory(prefix="torchport-roundtrip-") as scratch:
        out_json = Path(scratch) / "roundtrip.json"
        command = [
            sys.executable,
            "-I",
            "-m",
            "engine.serialize.roundtrip",
            os.fspath(Path(pt2_path).resolve()),
            os.fspath(Path(payload_path).resolve()),
            os.fspath(out_json),
        ]
        try:
            proc = subprocess.run(
                command,
                cwd=scratch,
                env=env,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return RoundtripCheck(
                status="failed",
                loader="subprocess",
                duration_s=time.perf_counter() - started,
                reason=f"the loading process ran over {timeout_s:g} s",
            )
        if proc.returncode != 0 or not out_json.exists():
            tail = proc.stderr.decode(errors="replace").strip().splitlines()[-1:]
            return RoundtripCheck(
                status="failed",
                loader="subprocess",
                duration_s=time.perf_counter() - started,
                reason=f"the loading process exited with {proc.returncode}: {' '.join(tail)}",
            )
        data = json.loads(out_json.read_text())
    data["loader"] = "subprocess"
    return RoundtripCheck.model_validate(data)


class _CapturedErrors(logging.Handler):
    """Keeps the first exception torch logged while loading."""

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.first: BaseException | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.first is None and record.exc_info and record.exc_info[1] is not None:
            self.first = record.exc_info[1]


def _describe(exc: BaseException) -> str:
    lines = _ANSI.sub("", str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def _detached(tree: Any) -> Any:
    return pytree.tree_map(lambda x: x.detach().clone() if isinstance(x, torch.Tensor) else x, tree)


def _compare_bitwise(
    expected_paths: list[str], expected: list[Any], actual: Any
) -> tuple[list[dict[str, Any]], str | None]:
    actual_leaves = flatten_with_paths(actual)[0]
    if len(expected) != len(actual_leaves):
        return [], (
            f"the loaded program returned {len(actual_leaves)} outputs, expected {len(expected)}"
        )
    outputs = [
        _compare_leaf(path, e, a)
        for path, e, (_, a) in zip(expected_paths, expected, actual_leaves, strict=True)
    ]
    if [path for path, _ in actual_leaves] != expected_paths:
        return outputs, "the loaded program returned its outputs in other containers"
    return outputs, None


def _compare_leaf(path: str, expected: Any, actual: Any) -> dict[str, Any]:
    if not isinstance(expected, torch.Tensor):
        return {
            "path": path,
            "shape": None,
            "dtype": type(expected).__name__,
            "max_abs_error": None,
            "passed": type(expected) is type(actual) and expected == actual,
        }
    check: dict[str, Any] = {
        "path": path,
        "shape": list(expected.shape),
        "dtype": str(expected.dtype).removeprefix("torch."),
        "max_abs_error": None,
        "passed": False,
    }
    if not isinstance(actual, torch.Tensor):
        return check
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return check
    e, a = expected.detach().cpu(), actual.detach().cpu()
    if e.is_floating_point() or e.is_complex():
        # Bit for bit up to NaN payloads: same NaN positions, same values, same signs
        # (torch.equal alone takes -0.0 for 0.0).
        er, ar = (torch.view_as_real(e), torch.view_as_real(a)) if e.is_complex() else (e, a)
        same_nan = torch.equal(er.isnan(), ar.isnan())
        kept = ~er.isnan()
        equal = (
            same_nan
            and torch.equal(er[kept], ar[kept])
            and torch.equal(er[kept].signbit(), ar[kept].signbit())
        )
        finite = ~e.isnan()
        if e.numel():
            diff = (e.to(torch.complex128 if e.is_complex() else torch.float64) - a).abs()
            diff = diff[finite & ~a.isnan()]
            check["max_abs_error"] = float(diff.max()) if diff.numel() else 0.0
        else:
            check["max_abs_error"] = 0.0
    else:
        equal = torch.equal(e, a)
        check["max_abs_error"] = 0.0 if equal else None
    check["passed"] = bool(equal)
    return check


if __name__ == "__main__":
    raise SystemExit(main())
