"""Target `executorch`: `model.pte`, lowered with the XNNPACK partitioner, run by the
ExecuTorch runtime's Python bindings.

Lowers the program *before* `run_decompositions`: XNNPACK delegates more of it that way
(linear stays linear instead of becoming addmm and permutes). Needs executorch 1.4.1 (the
release built against torch 2.13) and torchao, installed without their dependencies (see
README), imported here only when called.

What runs and what is written (for a sandbox profile): the `flatc` binary executorch
ships (`executorch/data/bin/flatc`; `$FLATC_EXECUTABLE` or `flatc` on PATH when the
package has none), reading and writing temporary schema and JSON files in `$TMPDIR`;
then `path`. Loading and running execute nothing. A call the runtime refuses is repeated
once with its log caught (`sys.stderr`, and fd 2 on a temporary file in `$TMPDIR`): the
error names the bound the log says it met. A generation-ready LLM's `.pte` is run again in
ExecuTorch's own LLM runner (`engine.targets.executorch_llm`).
"""

from __future__ import annotations

import contextlib
import gc
import io
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sympy
import torch
import torch.utils._pytree as pytree

from engine.targets import executorch_attention
from engine.targets.executorch_llm import runtime_generation
from engine.targets.interface import Conversion, TargetJob
from schemas import ExportOptions, VerifyOptions

if TYPE_CHECKING:
    from engine.generation import Encoder

__all__ = [
    "THREAD_SETTINGS",
    "bound",
    "convert",
    "convert_encoder",
    "load",
    "loading",
    "notes",
    "prepare",
    "runtime",
    "runtime_generation",
    "tolerances",
]

THREAD_SETTINGS = ("executorch.threadpool",)
"""What `load(threads=...)` sets: the process's one ExecuTorch thread pool (XNNPACK's)."""


def runtime() -> str:
    """The runtime `load` runs the program in, with its version."""
    from importlib.metadata import version

    return f"ExecuTorch {version('executorch')} runtime, XNNPACK delegate"


_DELEGATE = "executorch_call_delegate"


def prepare(job: TargetJob) -> Conversion:
    """The program before decomposition (XNNPACK delegates more of it; linear stays
    linear), or the job's quantized one with option `quantize`. A generation-ready
    export carries the runner's metadata methods; an encoder-decoder model's `.pte` holds
    the decoder as `text_decoder` and the encoder as a second method."""
    from engine.targets import encoders

    source = None
    settings: dict[str, Any] = {}
    started = time.perf_counter()
    if job.generation is not None and job.generation.encoder is None:
        if job.options.executorch.custom_ops:
            source, settings["attention"], widened = _custom_attention(job)
            if widened is not None:
                settings["widened_from"] = widened
        else:
            settings["attention"] = "executorch.custom_ops is false"
    if source is None:
        quantizing = job.quantizing
        source = quantizing.program("executorch") if quantizing is not None else job.traced
    settings["phases"] = {"program": time.perf_counter() - started}
    if job.generation is not None:
        settings["constant_methods"] = job.generation.runner_metadata()
        if job.generation.encoder is not None:
            settings.update(encoders.executorch_settings(job.generation.encoder))
    settings.update(job.overrides)
    return Conversion(source, job.args, job.kwargs, settings)


def _custom_attention(
    job: TargetJob,
) -> tuple[torch.export.ExportedProgram | None, str, str | None]:
    """A generation-ready LLM's program in ExecuTorch's custom-op form
    (`executorch_attention`), `ATTENTION`, and the dtype it was widened from (option
    `executorch.dtype`: a bfloat16 or float16 model unquantized, lowered in float32);
    else None, why it keeps the recipe's attention, and None."""
    from engine.load import module_copies
    from engine.quantization import PT2E_SCHEMES
    from engine.verify.precision import reduced_model

    quantizing, wrapper = job.quantizing, job.pristine
    if quantizing is not None and quantizing.scheme in PT2E_SCHEMES:
        return None, f"{quantizing.scheme} quantizes the recipe's program (PT2E)", None
    reduced = reduced_model(wrapper)
    widening = reduced and quantizing is None and job.options.executorch.dtype == "float32"
    widened = widening or (quantizing is not None and quantizing.widens("executorch"))
    why = executorch_attention.unsuited(wrapper, not reduced or widened)
    if why is not None:
        return None, why, None
    assert job.generation is not None
    dtype = next(str(p.dtype) for p in wrapper.parameters() if p.is_floating_point())
    try:
        source = module_copies.widened(wrapper) if widening else wrapper
        module = executorch_attention.form(source)
        del source
        if quantizing is not None:
            program = quantizing.form_program("executorch", module)
        else:
            program = executorch_attention.export(module, job.kwargs, job.generation.max_cache_len)
    except Exception as exc:  # the recipe's form is still there: a note, not a failure
        return None, f"the custom-op form did not export ({type(exc).__name__}: {exc})"[:400], None
    layers = len(getattr(wrapper, "static_cache").layers)  # noqa: B009 (a Module attribute)
    found = executorch_attention.lowered_attention(program)
    if found != layers:
        return None, f"{found} of {layers} layers' attention went through llama::custom_sdpa", None
    return (
        program,
        executorch_attention.ATTENTION,
        dtype.removeprefix("torch.") if widening else None,
    )


def loading(settings: dict[str, Any], facts: dict[str, Any]) -> dict[str, Any]:
    """The method the program's decoder is (`forward`, or `text_decoder` beside an
    encoder)."""
    return {key: value for key, value in settings.items() if key == "method"}


def tolerances(options: ExportOptions) -> VerifyOptions:
    """The job's verification options."""
    return options.verify


def convert_encoder(
    encoder: Encoder, path: Path, settings: dict[str, Any], facts: dict[str, Any]
) -> tuple[Any, list[Path]]:
    """The encoder is a method of the decoder's `.pte`, written with it: only loaded."""
    from engine.targets.encoders import ENCODER_METHOD

    assert encoder.traced is not None, "the encoder program is made first"
    return load(path, encoder.traced, method=ENCODER_METHOD), []


def convert(
    program: torch.export.ExportedProgram,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    path: Path,
    *,
    facts: dict[str, Any] | None = None,
    constant_methods: dict[str, Any] | None = None,
    method: str = "forward",
    extra_methods: Mapping[str, torch.export.ExportedProgram] | None = None,
    attention: str | None = None,
    phases: dict[str, float] | None = None,
    widened_from: str | None = None,
) -> Path:
    """Lower `program` to ExecuTorch with XNNPACK and write the `.pte` to `path`.

    Args:
        program: the exported program before `run_decompositions`.
        args, kwargs: its example inputs (unused: the program carries its own).
        path: the file to write.
        facts: filled with `delegated` (nodes handed to XNNPACK), `portable_ops` (ops
            left to ExecuTorch's portable kernels, with counts), `executorch` (version),
            `constant_methods` and, with several methods, `methods`.
        constant_methods: methods of the program that return a constant (an LLM's
            `get_max_seq_len`, `use_kv_cache`, …, which ExecuTorch's LLM runner reads).
        method: the name of `program`'s method in the `.pte`.
        extra_methods: more programs, each a method of the same `.pte` (an
            encoder-decoder model's `encoder` beside its `text_decoder`, as ExecuTorch's
            ASR runner and optimum-executorch name them).
        attention: a generation-ready LLM's: `executorch_attention.ATTENTION` when
            `program` is the custom-op form, else why not (`facts["attention"]`).
        phases: seconds spent before (`program`: making the program lowered here);
            `facts["phases_s"]` adds the lowering's own.
        widened_from: the model's dtype when `program` computes it in float32
            (`facts["widened_from"]`, option `executorch.dtype`).

    Returns:
        `path`.
    """
    programs = {method: program, **(extra_methods or {})}
    unbounded = [
        f"{name}: {dim}" if len(programs) > 1 else dim
        for name, each in programs.items()
        for dim in _unbounded_dims(each)
    ]
    if unbounded:
        from engine.targets import TargetError

        raise TargetError(
            "executorch: dynamic dims without an upper bound: "
            + ", ".join(unbounded)
            + " (the runtime plans memory for each dim's maximum)",
            hint="Give these dims a max in dynamic_shapes (e.g. Dim(..., max=512)), or leave "
            "executorch out of targets.",
            details={"unbounded": unbounded},
        )
    if facts is not None and attention is not None:
        used = attention == executorch_attention.ATTENTION
        facts["attention"] = "llama::custom_sdpa" if used else "recipe"
        if not used:
            facts["attention_reason"] = attention
    if facts is not None and widened_from is not None:
        facts["widened_from"] = widened_from
    try:
        _lower(programs, path, facts, constant_methods, dict(phases or {}))
    finally:  # failed or not: the lowered programs are not kept
        _forget_programs()
    return path


def _lower(
    programs: dict[str, torch.export.ExportedProgram],
    path: Path,
    facts: dict[str, Any] | None,
    constant_methods: dict[str, Any] | None,
    phases: dict[str, float],
) -> None:
    """`programs`, each a method, lowered with XNNPACK and written to `path`; the seconds
    of each phase added to `phases` (`facts["phases_s"]`)."""
    with _quiet_torchao():
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.exir import to_edge_transform_and_lower
        from executorch.version import __version__

    started = time.perf_counter()
    edge = to_edge_transform_and_lower(
        programs if len(programs) > 1 else next(iter(programs.values())),
        partitioner=[XnnpackPartitioner()],
        constant_methods=constant_methods,
    )
    phases["to_edge_transform_and_lower"] = time.perf_counter() - started
    if facts is not None:
        delegated, portable = 0, dict[str, int]()
        for name in programs:
            counted, left = _partition(edge.exported_program(name))
            delegated += counted
            for op, count in left.items():
                portable[op] = portable.get(op, 0) + count
        facts.update(delegated=delegated, portable_ops=portable, executorch=__version__)
        if len(programs) > 1:
            facts["methods"] = list(programs)
        if constant_methods:
            facts["constant_methods"] = dict(constant_methods)
    started = time.perf_counter()
    lowered = edge.to_executorch()
    phases["to_executorch"] = time.perf_counter() - started
    started = time.perf_counter()
    with path.open("wb") as handle:
        lowered.write_to_file(handle)
    phases["write"] = time.perf_counter() - started
    if facts is not None:
        facts["phases_s"] = {name: round(seconds, 3) for name, seconds in phases.items()}


def _forget_programs() -> None:
    """Drop the caches that keep the lowered programs, and with them every weight of the
    program converted, alive after the conversion: ExecuTorch's `is_same_node` (an
    `lru_cache` of graph nodes) and FakeTensorMode's dispatch cache (keys that hold the
    lowered backend modules). A 3.21B model's quantized weights stayed resident. Torch's
    proxy-tensor tracer also keeps the nodes of the last program it traced (for export's
    fake-tensor leak check) until the next trace, and with them their graph's module. And
    each XNNPACK partitioner config module's `why` (a `WhyNoPartition` logger) keeps the
    last node it refused, with its graph, the lowered module and the program's state
    dict: a 1.24B model's 1.2 GB of quantized weights stayed resident through it. So
    did the `lru_cache`s of ShapeEnv's methods, keyed by the lowering's ShapeEnv, and
    each ShapeEnv's own dispatch cache (`fake_tensor_cache`, keys holding the lowered
    modules), which lives as long as a symbolic size of its program anywhere."""
    from executorch.exir.backend import utils
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental import proxy_tensor
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    utils.is_same_node.cache_clear()
    FakeTensorMode.cache_clear()
    for cached in list(vars(ShapeEnv).values()):
        if callable(getattr(cached, "cache_clear", None)):
            cached.cache_clear()
    for found in gc.get_objects():
        if issubclass(type(found), ShapeEnv):  # (a dead weakref.proxy fails isinstance)
            found.fake_tensor_cache.clear()
    proxy_tensor._FAKE_TENSOR_ID_TO_PROXY_MAP_FOR_EXPORT.clear()
    for name, loaded in list(sys.modules.items()):
        if name.startswith("executorch.") and loaded is not None:
            for value in list(getattr(loaded, "__dict__", {}).values()):
                if issubclass(type(value), utils.WhyNoPartition):
                    value.node = None


def load(
    path: Path,
    program: torch.export.ExportedProgram,
    *,
    method: str = "forward",
    threads: int | None = None,
) -> Any:
    """The `.pte` at `path` in the ExecuTorch runtime, as a runner of flat outputs of
    its `method`.

    The method takes the leaves of `(args, kwargs)` in order (non-tensor ones too).
    Outputs are copied: the runtime reuses its planned memory on the next run. `threads`
    resizes ExecuTorch's thread pool first: one per process, shared by every loaded
    program (None leaves it as it is: by default one thread per performance core).
    """
    from executorch.runtime import Runtime

    executorch_attention.load_kernels()
    if threads is not None:
        from executorch.extension.pybindings import portable_lib

        if portable_lib._threadpool_get_thread_count() != threads:
            portable_lib._unsafe_reset_threadpool(threads)

    loaded = Runtime.get().load_program(str(path)).load_method(method)

    def run(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sequence[Any]:
        leaves = [
            leaf.detach().contiguous() if isinstance(leaf, torch.Tensor) else leaf
            for leaf in pytree.tree_leaves((tuple(args), dict(kwargs)))
        ]
        try:
            outputs = loaded.execute(leaves)
        except RuntimeError as exc:
            said = _logged(lambda: loaded.execute(leaves))
            if not said:
                raise
            raise RuntimeError(f"{str(exc).strip()} (the runtime: {' '.join(said)})") from exc
        return [out.clone() if isinstance(out, torch.Tensor) else out for out in outputs]

    return run


MAX_LOG = 1 << 16
"""Of what the runtime logs while a refused call is repeated, what is read back."""
_BOUND = re.compile(r"maximum capacity of (\d+) elements to (\d+) elements")
_INPUT = re.compile(r"at input (\d+)")


def _logged(call: Callable[[], object]) -> list[str]:
    """What the runtime logs while `call` runs again (its error says only `error 0x10`;
    the log says why): its non-empty lines, passed on to stderr too (the job's log keeps
    them). The Python bindings log through `sys.stderr`, a runtime built otherwise to fd 2:
    both are caught. Repeating the call is what reads the log without redirecting stderr
    around every successful call (profiles time them)."""
    sys.stderr.flush()
    python = io.StringIO()
    with tempfile.TemporaryFile() as sink:
        saved = os.dup(2)
        try:
            os.dup2(sink.fileno(), 2)
            with contextlib.redirect_stderr(python), contextlib.suppress(Exception):
                call()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        text = python.getvalue()[:MAX_LOG] + sink.read(MAX_LOG).decode(errors="replace")
    with contextlib.suppress(Exception):
        sys.stderr.write(text)
    return [line.strip() for line in text.splitlines() if line.strip()]


def bound(message: str) -> dict[str, Any] | None:
    """The memory plan's bound a refused input met, from the runtime's message: the
    tensor's `capacity` and the elements `requested` (and the method's `input_index`)."""
    found = _BOUND.search(message)
    if found is None:
        return None
    parsed: dict[str, Any] = {"capacity": int(found[1]), "requested": int(found[2])}
    at = _INPUT.search(message)
    if at is not None:
        parsed["input_index"] = int(at[1])
    return parsed


def notes(facts: dict[str, Any]) -> list[str]:
    """What a deployment should know."""
    limits = (
        "Dynamic dims run only up to their declared max (the runtime plans memory for "
        "it and refuses larger inputs)"
    )
    verified = facts.get("verified_range")
    if verified is not None:
        from engine.targets.failures import describe

        ran = describe(verified)
        limits = (
            "The runtime refused inputs inside the declared dynamic range (its memory plan "
            f"bounds them lower): verified for {ran or 'the example'} only"
        )
    found = [
        f"{limits}; the inputs are the leaves of (args, kwargs) in order.",
        f"XNNPACK runs {facts.get('delegated', 0)} delegated subgraph(s)",
    ]
    portable = facts.get("portable_ops") or {}
    if portable:
        found[-1] += "; ExecuTorch's portable kernels run " + ", ".join(sorted(portable)) + "."
    else:
        found[-1] += "; no op is left to the portable kernels."
    if facts.get("widened_from"):
        found.append(
            f"The model's {facts['widened_from']} weights and computation are float32 in "
            "model.pte (option executorch.dtype); verified against eager as a "
            "reduced-precision program is."
        )
    if facts.get("attention") == "llama::custom_sdpa":
        found.append(
            "Attention runs ExecuTorch's LLM ops: llama::update_cache writes each step's keys "
            "and values, llama::custom_sdpa attends over the filled positions only; the "
            "runtime needs their kernels (Python: from executorch.extension.llm.custom_ops "
            "import custom_ops, before loading it, TextLLMRunner included; C++: a runtime "
            "built with them)."
        )
    elif facts.get("attention") == "recipe":
        found.append(
            "Attention is transformers' static-cache recipe, over the whole cache at every "
            f"step: {facts.get('attention_reason')}."
        )
    return found


def _unbounded_dims(program: torch.export.ExportedProgram) -> list[str]:
    """The user inputs' dims (`x dim 0`) whose symbol has no finite upper bound."""
    user_inputs = set(program.graph_signature.user_inputs)
    found: list[str] = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        value = node.meta.get("val")
        if not isinstance(value, torch.Tensor):
            continue
        for index, dim in enumerate(value.shape):
            if not isinstance(dim, torch.SymInt):
                continue
            for symbol in dim.node.expr.free_symbols:
                bound = program.range_constraints.get(symbol)
                # torch's int_oo is a sympy number whose is_finite is True.
                if bound is None or not isinstance(bound.upper, sympy.Integer):
                    found.append(f"{node.name} dim {index}")
                    break
    return found


def _partition(program: torch.export.ExportedProgram) -> tuple[int, dict[str, int]]:
    delegated, portable = 0, dict[str, int]()
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        name = getattr(node.target, "__name__", str(node.target))
        if name.startswith("auto_functionalized"):  # run in place: the op it wraps
            name = str(node.args[0])
        if _DELEGATE in name:
            delegated += 1
        elif name != "getitem":
            portable[name] = portable.get(name, 0) + 1
    return delegated, portable


@contextmanager
def _quiet_torchao() -> Iterator[None]:
    """torchao logs a warning per CUDA library it cannot load on a CPU-only machine."""
    logger = logging.getLogger("torchao")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
