"""Verification in reduced precision: a bfloat16 or float16 program is judged against a
float32 reference of the same weights, next to the error eager PyTorch itself makes.

Two runs in bfloat16 (eager and the exported program) reorder their reductions and round
differently: on a 1.24B Llama their logits differ by ~0.1 while each is as far from the
float32 computation as the other. Comparing them with each other at bfloat16's tolerance
fails programs that are as good as eager. So when a reduced-precision output is outside
the tolerance (and the options set none), the eager model is run once more with float32
arithmetic on its own reduced-precision weights (`float32_reference`), and the output
passes when the program's error against that reference is within `PRECISION_RATIO` times
eager's own error against it (plus the dtype's absolute tolerance). Both errors are
reported (`OutputCheck.precision`), so "verified" means "no worse than running the model
in eager bfloat16".

Mutated buffers (a KV cache) are judged the same way: the reference run writes float32
copies of them, and those are what the program's and eager's buffers are measured against.

The float32 run keeps the weights where they are: each module's own parameters are cast
for the length of its forward (one module's weights in float32 at a time) and its
floating buffers replaced by float32 copies for the run, then restored.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.verify.flat import flatten_with_paths
from schemas import OutputCheck, PrecisionCheck, VerifyOptions

__all__ = [
    "PRECISION_RATIO",
    "REDUCED",
    "Sides",
    "against_float32",
    "float32_reference",
    "float32_run",
    "judge",
    "reduced",
    "reduced_model",
    "rounded_like",
    "widened",
]

REDUCED = (torch.float16, torch.bfloat16)

PRECISION_RATIO = 2.0
"""How many times eager's own error against the float32 reference the program's may be.
docs/engine.md gives the measured ratios this bound is set from."""


def reduced(tensor: Any) -> bool:
    """Whether `tensor` is a floating tensor in a reduced precision."""
    return isinstance(tensor, torch.Tensor) and tensor.dtype in REDUCED


def reduced_model(model: torch.nn.Module) -> bool:
    """Whether `model`'s floating weights are all bfloat16 or float16."""
    floating = [p.dtype for p in model.parameters() if p.is_floating_point()]
    return bool(floating) and all(dtype in REDUCED for dtype in floating)


def widened(value: Any) -> Any:
    """`value` in float32 when it is a reduced-precision tensor, else as it is."""
    return value.float() if reduced(value) else value


@contextlib.contextmanager
def _float32(module: torch.nn.Module) -> Iterator[dict[str, torch.Tensor]]:
    """Run `module` with float32 parameters and buffers, its own left as they are; yields
    a dict filled on exit with the float32 buffers as the run left them, by name."""
    handles = []
    saved: dict[tuple[int, str], torch.Tensor] = {}

    def before(mod: torch.nn.Module, _inputs: Any) -> None:
        for name, param in mod._parameters.items():
            if param is not None and param.dtype in REDUCED:
                saved[(id(mod), name)] = param.data
                param.data = param.data.float()

    def after(mod: torch.nn.Module, _inputs: Any, _output: Any) -> None:
        for name, param in mod._parameters.items():
            original = saved.pop((id(mod), name), None)
            if param is not None and original is not None:
                param.data = original

    buffers: list[tuple[str, torch.nn.Module, str, torch.Tensor]] = []
    forwards: list[tuple[torch.nn.Module, Any]] = []
    for prefix, mod in module.named_modules():
        for name, buffer in mod._buffers.items():
            if buffer is not None and buffer.dtype in REDUCED:
                buffers.append((f"{prefix}.{name}" if prefix else name, mod, name, buffer))
                mod._buffers[name] = buffer.float()
        if not any(p is not None and p.dtype in REDUCED for p in mod._parameters.values()):
            continue
        wide = _wide_forward(mod)
        if wide is not None:  # no float32 copy of the weight at all
            forwards.append((mod, mod.__dict__.get("forward")))
            mod.forward = wide
        else:
            handles.append(mod.register_forward_pre_hook(before))
            handles.append(mod.register_forward_hook(after, always_call=True))
    written: dict[str, torch.Tensor] = {}
    try:
        yield written
    finally:
        for handle in handles:
            handle.remove()
        for mod, own in forwards:
            if own is None:
                del mod.forward
            else:
                mod.forward = own
        for qualified, mod, name, buffer in buffers:
            wide = mod._buffers[name]
            if wide is not None:
                written[qualified] = wide
            mod._buffers[name] = buffer


CHUNK_BYTES = 64 << 20
"""The float32 slice of a big weight cast at a time (a 128256-token output layer of width
2048 would be 1 GB in float32 at once)."""


def _wide_forward(mod: torch.nn.Module) -> Any:
    """A float32 forward for a plain `Linear` (its weight cast `CHUNK_BYTES` of rows at a
    time) or `Embedding` (rows gathered, then widened: the same values), or None."""
    if type(mod) is torch.nn.Linear:
        linear = mod

        def linear_forward(x: torch.Tensor) -> torch.Tensor:
            weight, bias = linear.weight, linear.bias
            rows = max(1, CHUNK_BYTES // (4 * max(1, weight.shape[1])))
            parts = [
                torch.nn.functional.linear(
                    x,
                    weight[i : i + rows].float(),
                    None if bias is None else bias[i : i + rows].float(),
                )
                for i in range(0, weight.shape[0], rows)
            ]
            return torch.cat(parts, dim=-1)

        return linear_forward
    if type(mod) is torch.nn.Embedding and mod.max_norm is None:
        embedding = mod

        def embedding_forward(ids: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.embedding(ids, embedding.weight).float()

        return embedding_forward
    return None


def float32_run(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, dict[str, torch.Tensor]]:
    """`module`'s outputs computed in float32 from its own weights (floating inputs in a
    reduced precision are widened too), and its reduced-precision buffers after the run,
    in float32."""

    args, kwargs = pytree.tree_map(widened, (args, kwargs))
    with torch.no_grad(), _float32(module) as written:
        outputs = module(*args, **kwargs)
    return outputs, written


def float32_reference(
    module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """`module`'s outputs computed in float32 from its own weights."""
    return float32_run(module, args, kwargs)[0]


def rounded_like(expected: Any, actual: Any) -> Any:
    """`actual` with each float32 tensor whose `expected` counterpart is in a reduced
    precision rounded to that dtype (a widened artifact's outputs, as the model's); the
    structure as it is when the two do not match leaf for leaf."""
    want, got = pytree.tree_leaves(expected), pytree.tree_leaves(actual)
    if len(want) != len(got):
        return actual
    leaves, spec = pytree.tree_flatten(actual)
    return pytree.tree_unflatten(
        [
            a.to(e.dtype)
            if reduced(e) and isinstance(a, torch.Tensor) and a.dtype == torch.float32
            else a
            for e, a in zip(want, leaves, strict=True)
        ],
        spec,
    )


def judge(
    expected: torch.Tensor, actual: torch.Tensor, reference: torch.Tensor, atol: float
) -> PrecisionCheck:
    """A reduced-precision output (`actual`, the program's) against the float32
    `reference`, next to eager's (`expected`)."""
    wide = reference.detach().to(torch.float64)
    eager_error = float((expected.detach().to(torch.float64) - wide).abs().max())
    program_error = float((actual.detach().to(torch.float64) - wide).abs().max())
    bound = PRECISION_RATIO * eager_error + atol
    return PrecisionCheck(
        reference="float32",
        eager_error=eager_error,
        exported_error=program_error,
        ratio=PRECISION_RATIO,
        passed=program_error <= bound,
    )


@dataclass
class Sides:
    """One side of a sample (eager's or the program's): its outputs, and its buffers
    after the run by name."""

    outputs: Any
    buffers: dict[str, torch.Tensor]


def against_float32(
    checks: tuple[list[OutputCheck], list[OutputCheck]],
    eager: Callable[[], torch.nn.Module],
    inputs: tuple[tuple[Any, ...], dict[str, Any]],
    expected: Sides,
    actual: Sides,
    opts: VerifyOptions,
) -> tuple[list[OutputCheck], list[OutputCheck]]:
    """The output and buffer `checks` with the reduced-precision ones outside the
    tolerance judged again against a float32 reference of the same weights, when the
    options set no tolerance of their own. The reference costs one more eager run (on a
    fresh copy from `eager`), made only when such a check failed."""
    outputs, buffers = checks
    expected_leaves = pytree.tree_leaves(expected.outputs)
    failing_outputs = [
        i
        for i, (check, leaf) in enumerate(zip(outputs, expected_leaves, strict=True))
        if not check.passed and reduced(leaf)
    ]
    failing_buffers = [
        i
        for i, check in enumerate(buffers)
        if not check.passed
        and reduced(expected.buffers.get(check.path))
        and reduced(actual.buffers.get(check.path))
    ]
    if not (failing_outputs or failing_buffers) or opts.atol is not None or opts.rtol is not None:
        return outputs, buffers
    try:
        reference, written = float32_run(eager(), *copy.deepcopy(inputs))
    except Exception:  # the model refuses float32 arithmetic: the plain judgement stands
        return outputs, buffers
    references = pytree.tree_leaves(reference)
    judged_outputs = list(outputs)
    if len(references) == len(outputs):
        leaves = [leaf for _, leaf in flatten_with_paths(actual.outputs)[0]]
        for i in failing_outputs:
            judged_outputs[i] = _judged(outputs[i], expected_leaves[i], leaves[i], references[i])
    judged_buffers = list(buffers)
    for i in failing_buffers:
        path = buffers[i].path
        if path in written:
            judged_buffers[i] = _judged(
                buffers[i], expected.buffers[path], actual.buffers[path], written[path]
            )
    return judged_outputs, judged_buffers


def _judged(
    check: OutputCheck, expected: torch.Tensor, actual: torch.Tensor, reference: torch.Tensor
) -> OutputCheck:
    if reference.shape != expected.shape:
        return check
    verdict = judge(expected, actual, reference, check.atol or 0.0)
    message = None if verdict.passed else "worse than eager against a float32 reference"
    return check.model_copy(
        update={"passed": verdict.passed, "precision": verdict, "message": message}
    )
