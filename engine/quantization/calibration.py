"""Calibration inputs of `quantize.scheme: int8`: the `calibration` upload (docs/contract.md §1).

A list of example inputs, each as an `inputs` upload holds one:
- `.safetensors`: tensors named `<n>.args.<i>` and `<n>.kwargs.<name>`, samples numbered
  0, 1, 2, …;
- `.pt`: `torch.save` of a list whose items are what an inputs `.pt` holds (a dict with
  "args" and "kwargs", or a tuple of positional inputs), read with `weights_only=True`;
- `.json`: a list of inputs specs, each as an inputs `.json` (a spec without `seed` is drawn
  with its index as the seed, so the samples differ).

`read` checks each sample against the example inputs when the model is loaded (the same
arguments, tensors of the same dtypes and ranks, the same non-tensor values); `check_ranges`
checks their shapes against the traced program's dynamic ranges before anything is
calibrated. Every failure is `invalid_inputs` with `details.source = "calibration"` and,
for one sample, its index in `details.sample`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.utils import _pytree as pytree

from engine.errors import InvalidInputs, InvalidRequest
from engine.load.inputs import (
    build_inputs,
    detect_format,
    load_pt,
    load_safetensors,
    normalize_inputs,
)

__all__ = ["MAX_SAMPLES", "calibration_inputs", "check_ranges", "read"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]

MAX_SAMPLES = 256
"""Most samples a calibration file may hold (PT2E runs the model once per sample)."""

_KEY = re.compile(
    r"^(?P<sample>0|[1-9][0-9]*)\.(?:args\.(?P<index>0|[1-9][0-9]*)|kwargs\.(?P<name>[A-Za-z_]\w*))$"
)
_HINT = (
    "Upload a list of example inputs shaped like the model's own: .safetensors with tensors "
    "`<n>.args.<i>` / `<n>.kwargs.<name>`, a torch.save'd list of {'args': …, 'kwargs': …}, "
    "or a JSON list of inputs specs (docs/contract.md §1)."
)


def _error(message: str, stage: str, hint: str = _HINT, **details: Any) -> InvalidInputs:
    return InvalidInputs(
        message, hint=hint, stage=stage, details={"source": "calibration", **details}
    )


def read(path: Path, example: Inputs, scheme: str, *, stage: str = "loading") -> list[Inputs]:
    """The samples of the calibration file at `path`, each checked against `example`.

    Raises:
        InvalidRequest: `scheme` is not `int8` (no other scheme reads calibration inputs).
        InvalidInputs: an unreadable file, an unknown format, a pickle payload, no sample or
            more than `MAX_SAMPLES`, or a sample unlike the example.
    """
    if scheme != "int8":
        raise InvalidRequest(
            f"A calibration file is read only by quantize.scheme int8, not {scheme}.",
            hint="Set quantize.scheme to int8, or leave the calibration file out.",
            stage=stage,
            details={"field": "calibration", "reason": "calibration_unused", "scheme": scheme},
        )
    fmt = detect_format(path)
    if fmt == "safetensors":
        samples = _read_safetensors(path, stage)
    elif fmt == "pt":
        samples = _read_pt(path, stage)
    elif fmt == "json":
        samples = _read_json(path, stage)
    else:
        raise _error(
            "The calibration file is not .safetensors, .pt or .json.", stage, file=path.name
        )
    _check_count(len(samples), fmt, stage)
    for index, sample in enumerate(samples):
        _check_like(sample, example, index, stage)
    return samples


def calibration_inputs(
    program: torch.export.ExportedProgram,
    example: Inputs,
    uploaded: list[Inputs] | None,
    samples: int,
) -> tuple[list[Inputs], str]:
    """What static `int8` calibrates on, and where it came from: the uploaded samples
    (checked against `program`), or else the example and `samples` verification samples
    drawn inside the program's dynamic ranges (of the example's shapes with other values
    when it has none, as quantization's accuracy is measured).

    Raises:
        InvalidInputs: an uploaded sample the program cannot take."""
    if uploaded is not None:
        check_ranges(program, uploaded, stage="converting")
        return list(uploaded), "upload"
    from engine.shapes.sampling import draw_samples, draw_values

    found = [example]
    drawn_samples = draw_samples(program, example[0], example[1], samples, 0)
    for _, _, drawn in drawn_samples or draw_values(example[0], example[1], samples, 0):
        if not isinstance(drawn, str):
            found.append(drawn)
    return found, "samples"


def _check_count(count: int, fmt: str, stage: str) -> None:
    if not 1 <= count <= MAX_SAMPLES:
        raise _error(
            f"The calibration file holds {count} samples; 1 to {MAX_SAMPLES} are taken.",
            stage,
            format=fmt,
            samples=count,
            limit=MAX_SAMPLES,
        )


def check_ranges(
    program: torch.export.ExportedProgram, samples: list[Inputs], *, stage: str
) -> None:
    """Each sample inside `program`'s input shapes and dynamic ranges, as its module's own
    input check judges it (without running the model).

    Raises:
        InvalidInputs: a sample the program cannot take (`details.sample`, `details.problem`).
    """
    from torch._export.utils import _check_input_constraints_for_graph

    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    user = [
        placeholders[spec.arg.name]
        for spec in program.graph_signature.input_specs
        if spec.kind == torch.export.graph_signature.InputKind.USER_INPUT
        and spec.arg.name in placeholders
    ]
    for index, (args, kwargs) in enumerate(samples):
        flat, _ = pytree.tree_flatten_with_path((args, kwargs))
        try:
            _check_input_constraints_for_graph(user, flat, program.range_constraints)
        except Exception as exc:  # torch raises RuntimeError or AssertionError
            raise _error(
                f"Calibration sample {index} does not fit the exported program: {exc}"[:400],
                stage,
                hint="Give every sample the example's static sizes and keep dynamic sizes "
                "inside the ranges the program was exported with (report.json "
                "range_constraints).",
                sample=index,
                reason="outside_program",
                problem=str(exc)[:300],
            ) from exc


def _check_like(sample: Inputs, example: Inputs, index: int, stage: str) -> None:
    args, kwargs = sample
    if len(args) != len(example[0]) or set(kwargs) != set(example[1]):
        raise _error(
            f"Calibration sample {index} has other arguments than the example inputs.",
            stage,
            sample=index,
            reason="other_arguments",
            args=len(args),
            expected_args=len(example[0]),
            kwargs=sorted(kwargs),
            expected_kwargs=sorted(example[1]),
        )
    ordered = {name: kwargs[name] for name in example[1]}
    leaves, spec = pytree.tree_flatten_with_path((args, ordered))
    expected, expected_spec = pytree.tree_flatten_with_path(example)
    if spec != expected_spec:
        raise _error(
            f"Calibration sample {index} is nested differently from the example inputs.",
            stage,
            sample=index,
            reason="other_structure",
        )
    for (path, value), (_, want) in zip(leaves, expected, strict=True):
        where = pytree.keystr(path)
        if isinstance(want, torch.Tensor):
            if not isinstance(value, torch.Tensor) or (value.dtype, value.dim()) != (
                want.dtype,
                want.dim(),
            ):
                got = (
                    f"{value.dtype} of rank {value.dim()}"
                    if isinstance(value, torch.Tensor)
                    else type(value).__name__
                )
                raise _error(
                    f"Calibration sample {index}: input {where} is {got}, the example's is "
                    f"{want.dtype} of rank {want.dim()}.",
                    stage,
                    sample=index,
                    reason="other_tensor",
                    input=where,
                )
        elif value != want:
            raise _error(
                f"Calibration sample {index}: the non-tensor input {where} differs from the "
                "example's (it is a constant of the exported program).",
                stage,
                sample=index,
                reason="other_constant",
                input=where,
            )


def _read_safetensors(path: Path, stage: str) -> list[Inputs]:
    tensors = load_safetensors(path, source="calibration", stage=stage)
    positional: dict[int, dict[int, torch.Tensor]] = {}
    keyword: dict[int, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise _error(
                "A tensor in the calibration file is not named `<n>.args.<i>` or "
                "`<n>.kwargs.<name>`.",
                stage,
                format="safetensors",
                key=key,
            )
        sample = int(match["sample"])
        _check_count(sample + 1, "safetensors", stage)
        if match["index"] is not None:
            positional.setdefault(sample, {})[int(match["index"])] = tensor
        else:
            keyword.setdefault(sample, {})[match["name"]] = tensor
    count = max([*positional, *keyword], default=-1) + 1
    samples: list[Inputs] = []
    for sample in range(count):
        args = positional.get(sample, {})
        missing = [f"{sample}.args.{i}" for i in range(max(args, default=-1) + 1) if i not in args]
        if sample not in positional and sample not in keyword:
            missing = [f"{sample}.*"]
        if missing:
            raise _error(
                "The calibration file's samples or their positional tensors are not "
                "numbered 0, 1, 2, …",
                stage,
                format="safetensors",
                missing=missing[:20],
            )
        samples.append((tuple(args[i] for i in range(len(args))), keyword.get(sample, {})))
    return samples


def _read_pt(path: Path, stage: str) -> list[Inputs]:
    obj = load_pt(path, source="calibration", stage=stage)
    return _samples(obj, "pt", stage, _pt_sample)


def _pt_sample(item: Any) -> Inputs:
    if not isinstance(item, dict):
        return normalize_inputs(item, None, source="calibration")
    unexpected = sorted(str(k) for k in item if k not in ("args", "kwargs"))
    if unexpected:
        raise InvalidInputs(
            'A .pt calibration sample dict may only have the keys "args" and "kwargs".',
            hint=_HINT,
            details={"source": "calibration", "format": "pt", "unexpected": unexpected},
        )
    return normalize_inputs(item.get("args", ()), item.get("kwargs"), source="calibration")


def _samples(items: Any, fmt: str, stage: str, convert: Callable[[Any], Inputs]) -> list[Inputs]:
    """Each of `items` (a list of 1 to `MAX_SAMPLES`) as a sample; a failure names it."""
    if not isinstance(items, list):
        raise _error(
            f"The .{fmt} calibration file does not hold a list of samples.",
            stage,
            format=fmt,
            got=type(items).__name__,
        )
    _check_count(len(items), fmt, stage)
    samples = []
    for index, item in enumerate(items):
        try:
            samples.append(convert(item if fmt != "json" else _seeded(item, index)))
        except InvalidInputs as exc:
            exc.details.update(source="calibration", sample=index)
            exc.stage = stage
            raise
    return samples


def _seeded(spec: Any, index: int) -> Any:
    """A JSON spec without `seed` drawn with its index as the seed."""
    return {**spec, "seed": index} if isinstance(spec, dict) and "seed" not in spec else spec


def _read_json(path: Path, stage: str) -> list[Inputs]:
    try:
        specs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _error(
            "The .json calibration file is not valid JSON.",
            stage,
            format="json",
            exception=type(exc).__name__,
            line=getattr(exc, "lineno", None),
        ) from exc
    return _samples(specs, "json", stage, build_inputs)
