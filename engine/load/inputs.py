"""Example inputs: the uploaded inputs file, or the entry module's `example_args`.

Three file formats (docs/contract.md §1):
- `.safetensors`: tensors named `args.0`, `args.1`, …, `kwargs.<name>`;
- `.pt`: `torch.save` of `{"args": tuple, "kwargs": dict}` or of a tuple, read with
  `weights_only=True` and never with a pickle fallback;
- `.json`: a spec turned into tensors, e.g. `{"args": [{"shape": [2, 3], "dtype":
  "float32", "fill": "randn"}, 4], "kwargs": {}, "seed": 0}`.

Every failure is an `InvalidInputs` whose details name the upload, the format and,
where it applies, the offending key or path.
"""

from __future__ import annotations

import inspect
import json
import math
import pickle
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from torch.utils import _pytree as pytree

from engine.errors import InvalidInputs
from schemas import InputSummary

STAGE = "loading"

Inputs = tuple[tuple[Any, ...], dict[str, Any]]
"""Positional and keyword example inputs."""

_SAFETENSORS_KEY = re.compile(
    r"^(?:args\.(?P<index>0|[1-9][0-9]*)|kwargs\.(?P<name>[A-Za-z_]\w*))$"
)
_RANDINT = re.compile(r"^randint\(\s*(?P<lo>-?\d+)\s*,\s*(?P<hi>-?\d+)\s*\)$")
_TENSOR_SPEC_KEYS = frozenset({"shape", "dtype", "fill"})
_SPEC_KEYS = frozenset({"args", "kwargs", "seed"})
_PT_KEYS = frozenset({"args", "kwargs"})
MAX_SUMMARIZED_INPUTS = 1000
"""Most input leaves `summarize_inputs` lists (a report stays small whatever the inputs)."""
_MAX_REPR = 200


def read_inputs(path: Path) -> Inputs:
    """Read an uploaded inputs file into `(args, kwargs)`.

    The format follows the suffix (`.safetensors`, `.pt`/`.pth`, `.json`); a file
    without a known suffix is recognised by its first bytes.

    Raises:
        InvalidInputs: the file is unreadable, of an unknown format, holds a pickle
            payload, or does not have the expected structure.
    """
    fmt = detect_format(path)
    if fmt == "safetensors":
        return _read_safetensors(path)
    if fmt == "pt":
        return _read_pt(path)
    if fmt == "json":
        return _read_json(path)
    raise InvalidInputs(
        "The inputs file is not .safetensors, .pt or .json.",
        hint="Upload example inputs as .safetensors, a torch.save'd .pt, or a JSON spec.",
        stage=STAGE,
        details={"source": "inputs", "file": path.name},
    )


def detect_format(path: Path) -> str | None:
    """`safetensors`, `pt`, `json`, or None: by suffix, else by the file's first bytes."""
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return "safetensors"
    if suffix in (".pt", ".pth", ".bin"):
        return "pt"
    if suffix == ".json":
        return "json"
    try:
        with path.open("rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"PK\x03\x04"):
        return "pt"
    if len(head) > 8 and head[8:9] == b"{":
        return "safetensors"
    if head.lstrip()[:1] in (b"{", b"["):
        return "json"
    return None


def normalize_inputs(args: Any, kwargs: Any, *, source: str) -> Inputs:
    """Check and normalize example inputs: a single tensor or a list becomes a tuple.

    `source` says where they came from (`example_args`, `inputs`), for the details.
    """
    if isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    if not isinstance(args, tuple):
        raise InvalidInputs(
            "The positional example inputs are not a tuple.",
            stage=STAGE,
            details={"source": source, "key": "args", "got": type(args).__name__},
        )
    if kwargs is None:
        kwargs = {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise InvalidInputs(
            "The keyword example inputs are not a dict with string keys.",
            stage=STAGE,
            details={"source": source, "key": "kwargs", "got": type(kwargs).__name__},
        )
    return args, dict(kwargs)


def load_safetensors(path: Path, *, source: str = "inputs", stage: str = STAGE) -> Any:
    """The tensors of an uploaded `.safetensors` file (`source`: the upload's role).

    Raises:
        InvalidInputs: the file cannot be read."""
    try:
        return safetensors.torch.load_file(str(path), device="cpu")
    except Exception as exc:
        raise _unreadable("safetensors", source, stage, exc) from exc


def load_pt(path: Path, *, source: str = "inputs", stage: str = STAGE) -> Any:
    """What an uploaded `.pt` file holds, read with `weights_only=True` and never with a
    pickle fallback (`source`: the upload's role).

    Raises:
        InvalidInputs: the file holds other Python objects (`details.pickle_refused`) or
            cannot be read."""
    try:
        # weights_only=True passed explicitly: no environment variable can turn it off.
        return torch.load(str(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise InvalidInputs(
            f"The .pt {source} file holds Python objects other than tensors and "
            "containers; it was refused without being unpickled.",
            hint="Save only tensors, tuples, lists and dicts, or use .safetensors.",
            stage=stage,
            details={
                "source": source,
                "format": "pt",
                "exception": type(exc).__name__,
                "pickle_refused": True,
            },
        ) from exc
    except Exception as exc:
        raise _unreadable("pt", source, stage, exc) from exc


def _unreadable(kind: str, source: str, stage: str, exc: Exception) -> InvalidInputs:
    return InvalidInputs(
        f"The .{kind} {source} file cannot be read.",
        stage=stage,
        details={"source": source, "format": kind, "exception": type(exc).__name__},
    )


def _read_safetensors(path: Path) -> Inputs:
    tensors = load_safetensors(path)
    positional: dict[int, torch.Tensor] = {}
    kwargs: dict[str, torch.Tensor] = {}
    for key, tensor in tensors.items():
        match = _SAFETENSORS_KEY.match(key)
        if match is None:
            raise InvalidInputs(
                "A tensor in the inputs file is not named `args.<i>` or `kwargs.<name>`.",
                stage=STAGE,
                details={"source": "inputs", "format": "safetensors", "key": key},
            )
        if match["index"] is not None:
            positional[int(match["index"])] = tensor
        else:
            kwargs[match["name"]] = tensor
    missing = [f"args.{i}" for i in range(max(positional, default=-1) + 1) if i not in positional]
    if missing:
        raise InvalidInputs(
            "The positional tensors in the inputs file are not numbered 0, 1, 2, …",
            stage=STAGE,
            details={"source": "inputs", "format": "safetensors", "missing": missing},
        )
    return tuple(positional[i] for i in range(len(positional))), kwargs


def _read_pt(path: Path) -> Inputs:
    obj = load_pt(path)
    if isinstance(obj, Mapping):
        unexpected = sorted(str(k) for k in obj if k not in _PT_KEYS)
        if unexpected:
            raise InvalidInputs(
                'A .pt inputs dict may only have the keys "args" and "kwargs".',
                stage=STAGE,
                details={"source": "inputs", "format": "pt", "unexpected": unexpected},
            )
        return normalize_inputs(obj.get("args", ()), obj.get("kwargs"), source="inputs")
    return normalize_inputs(obj, None, source="inputs")


def _read_json(path: Path) -> Inputs:
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInputs(
            "The .json inputs file is not valid JSON.",
            stage=STAGE,
            details={
                "source": "inputs",
                "format": "json",
                "exception": type(exc).__name__,
                "line": getattr(exc, "lineno", None),
            },
        ) from exc
    return build_inputs(spec)


def build_inputs(spec: Any) -> Inputs:
    """Turn a JSON inputs spec into `(args, kwargs)`.

    The spec is `{"args": [...], "kwargs": {...}, "seed": 0}` (a bare list means
    `args`). A dict whose keys include `shape` and are among `shape`, `dtype` (default
    float32) and `fill` describes a tensor; `fill` is `randn | rand | zeros | ones |
    arange | randint(lo,hi)` (default randn for floating dtypes, randint(0,10) for
    integers and randint(0,2) for bool). Other JSON values pass through.
    """
    if isinstance(spec, list):
        spec = {"args": spec}
    if not isinstance(spec, dict):
        raise _spec_error("The JSON inputs spec is not an object.", "", spec)
    unexpected = sorted(set(spec) - _SPEC_KEYS)
    if unexpected:
        raise InvalidInputs(
            'The JSON inputs spec may only have the keys "args", "kwargs" and "seed".',
            stage=STAGE,
            details={"source": "inputs", "format": "json", "unexpected": unexpected},
        )
    seed = spec.get("seed", 0)
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise _spec_error("`seed` is not an integer.", "seed", seed)
    args = spec.get("args", [])
    kwargs = spec.get("kwargs", {})
    if not isinstance(args, list):
        raise _spec_error("`args` is not a list.", "args", args)
    if not isinstance(kwargs, dict):
        raise _spec_error("`kwargs` is not an object.", "kwargs", kwargs)
    generator = torch.Generator().manual_seed(seed)
    built_args = tuple(_build_value(v, f"args.{i}", generator) for i, v in enumerate(args))
    built_kwargs = {k: _build_value(v, f"kwargs.{k}", generator) for k, v in kwargs.items()}
    return built_args, built_kwargs


def _build_value(value: Any, path: str, generator: torch.Generator) -> Any:
    if isinstance(value, dict):
        if "shape" in value and set(value) <= _TENSOR_SPEC_KEYS:
            return _build_tensor(value, path, generator)
        return {k: _build_value(v, f"{path}.{k}", generator) for k, v in value.items()}
    if isinstance(value, list):
        return [_build_value(v, f"{path}.{i}", generator) for i, v in enumerate(value)]
    return value


def _build_tensor(spec: dict[str, Any], path: str, generator: torch.Generator) -> torch.Tensor:
    shape = spec["shape"]
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise _spec_error("`shape` is not a list of non-negative integers.", f"{path}.shape", shape)
    dtype_name = spec.get("dtype", "float32")
    dtype = getattr(torch, str(dtype_name).removeprefix("torch."), None)
    if not isinstance(dtype_name, str) or not isinstance(dtype, torch.dtype):
        raise _spec_error("`dtype` is not a torch dtype name.", f"{path}.dtype", dtype_name)
    floating = dtype.is_floating_point or dtype.is_complex
    default_fill = (
        "randn" if floating else ("randint(0,2)" if dtype == torch.bool else "randint(0,10)")
    )
    fill = spec.get("fill", default_fill)
    if not isinstance(fill, str):
        raise _spec_error("`fill` is not a string.", f"{path}.fill", fill)
    fill = fill.replace(" ", "")
    size = tuple(shape)
    if fill in ("randn", "rand"):
        if not floating:
            raise _spec_error(
                f"`{fill}` needs a floating dtype.", f"{path}.fill", fill, dtype=dtype_name
            )
        sample = torch.randn if fill == "randn" else torch.rand
        # Drawn in float32 (or the complex dtype) so half precisions get the same stream.
        draw_dtype = dtype if dtype.is_complex else torch.float32
        return sample(size, generator=generator, dtype=draw_dtype).to(dtype)
    if fill == "zeros":
        return torch.zeros(size, dtype=dtype)
    if fill == "ones":
        return torch.ones(size, dtype=dtype)
    if fill == "arange":
        numel = 1
        for d in size:
            numel *= d
        return torch.arange(numel).reshape(size).to(dtype)
    match = _RANDINT.match(fill)
    if match is not None:
        lo, hi = int(match["lo"]), int(match["hi"])
        if lo >= hi:
            raise _spec_error("`randint(lo,hi)` needs lo < hi.", f"{path}.fill", fill)
        return torch.randint(lo, hi, size, generator=generator).to(dtype)
    raise _spec_error(
        "`fill` is not randn, rand, zeros, ones, arange or randint(lo,hi).", f"{path}.fill", fill
    )


def _spec_error(message: str, path: str, value: Any, **extra: Any) -> InvalidInputs:
    shown = value if isinstance(value, str | int | float | bool | type(None)) else repr(value)[:200]
    return InvalidInputs(
        message,
        stage=STAGE,
        details={"source": "inputs", "format": "json", "path": path, "value": shown, **extra},
    )


def summarize_inputs(
    forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[InputSummary]:
    """Every leaf of the example inputs with its path, the parameter it binds to, its
    shape and dtype (tensors) or value (anything else), for `report.json`'s `inputs`.

    Args:
        forward: the module's `forward`, whose signature names the arguments.
        args: the positional example inputs.
        kwargs: the keyword example inputs.
    """
    names = parameter_names(forward, args, kwargs)
    try:
        flat = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))[0]
    except Exception:  # a container type pytree cannot give key paths for: its top level
        flat = [
            *(((pytree.SequenceKey(0), pytree.SequenceKey(i)), v) for i, v in enumerate(args)),
            *(((pytree.SequenceKey(1), pytree.MappingKey(k)), v) for k, v in kwargs.items()),
        ]
    summaries = []
    for keys, leaf in flat[:MAX_SUMMARIZED_INPUTS]:
        top = (getattr(keys[0], "idx", 0), _key_of(keys[1])) if len(keys) > 1 else None
        path = ("kwargs" if top and top[0] == 1 else "args") + pytree.keystr(tuple(keys[1:]))
        summary = InputSummary(path=path, name=names.get(top) if top else None, type="Tensor")
        if isinstance(leaf, torch.Tensor):
            summary.shape = [int(size) for size in leaf.shape]
            summary.dtype = str(leaf.dtype).removeprefix("torch.")
        else:
            summary.type = type(leaf).__name__
            summary.value = _plain_value(leaf)
        summaries.append(summary)
    return summaries


def _key_of(key: Any) -> Any:
    return getattr(key, "idx", getattr(key, "key", None))


def parameter_names(
    forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> dict[tuple[int, Any], str | None]:
    """(0, position) or (1, keyword) → the parameter name, when the inputs bind to forward."""
    try:
        signature = inspect.signature(forward)
        bound = signature.bind(*args, **kwargs)
    except (TypeError, ValueError):
        return {}
    names: dict[tuple[int, Any], str | None] = {}
    position = 0
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_POSITIONAL:
            # `*args` has no name per position in the dynamic-shapes JSON
            for _ in value:
                names[(0, position)] = None
                position += 1
        elif kind is inspect.Parameter.VAR_KEYWORD:
            names.update({(1, key): key for key in value})
        elif position < len(args) and kind is not inspect.Parameter.KEYWORD_ONLY:
            names[(0, position)] = name
            position += 1
        else:
            names[(1, name)] = name
    return names


def _plain_value(value: Any) -> Any:
    if value is None or isinstance(value, bool | int | str):
        return value if not isinstance(value, str) else value[:_MAX_REPR]
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    return repr(value)[:_MAX_REPR]
