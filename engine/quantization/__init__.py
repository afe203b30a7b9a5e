"""Quantized deployment targets (option `quantize`, `report.quantization`).

- `schemes`: which target takes which scheme (torch-free);
- `pt2e`: `int8` / `int8_dynamic` programs by PT2E with the XNNPACK quantizer;
- `linears`: `int8_weight_only` / `int4_weight_only` / `8da4w` programs by torchao;
- `onnx_runtime`: `int8` / `int8_dynamic` ONNX models by ONNX Runtime's quantizer;
- `accuracy`: a quantized artifact against the float eager model, within the budget or not.

`Quantizing` is what the pipeline hands each target: the options, the float module and
program, and the calibration inputs; it makes the quantized program once, when the first
target that needs one asks. Everything runs in the job's own (sandboxed) process.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.quantization import accuracy
from engine.quantization.schemes import METHODS, TARGET_SCHEMES, refusal, takes
from engine.verify.precision import reduced_model
from schemas.options import QuantizeOptions
from schemas.quantization import QuantizationReport

__all__ = ["METHODS", "TARGET_SCHEMES", "Quantizing", "accuracy", "refusal", "takes"]

Inputs = tuple[tuple[Any, ...], dict[str, Any]]

PT2E_SCHEMES = ("int8", "int8_dynamic")
"""The schemes quantized on the traced program by PT2E; the others quantize the module's
linears with torchao and export it again."""


@dataclass
class Quantizing:
    """One job's quantization, shared by its targets.

    Attributes:
        options: option `quantize` (its scheme is not `none`).
        traced: the float program before `run_decompositions`.
        pristine: the float eager module, never run itself (copied).
        args, kwargs: the example inputs.
        dynamic_shapes: the torch spec the program was exported with.
        calibration: the inputs static `int8` is calibrated on: the `calibration` upload's
            (`calibration_source` "upload"), or the example and the verification samples.
        strict: re-export a torchao-quantized copy in strict mode (when the float
            program was traced so).
        report: `report.quantization`, filled in by each target.
    """

    options: QuantizeOptions
    traced: torch.export.ExportedProgram
    pristine: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    dynamic_shapes: Any = None
    calibration: list[Inputs] = field(default_factory=list)
    calibration_source: str = "samples"
    strict: bool = False
    report: QuantizationReport | None = None
    fallbacks: dict[str, list[str]] = field(default_factory=dict)
    """By target: what static `int8` left float after the full quantization missed the
    budget on the calibration samples (`method` names it)."""
    pending: set[str] = field(default_factory=set)
    """The targets not converted yet (`converted` keeps the programs they need)."""
    _programs: dict[str, torch.export.ExportedProgram] = field(default_factory=dict)

    def __post_init__(self) -> None:
        grouped = self.options.scheme in ("int4_weight_only", "8da4w")
        self.report = QuantizationReport(
            scheme=self.options.scheme,
            budget="max_abs" if self.options.max_abs is not None else "min_cosine",
            min_cosine=None if self.options.max_abs is not None else self.options.min_cosine,
            max_abs=self.options.max_abs,
            group_size=self.options.group_size if grouped else None,
            calibration_samples=len(self.calibration) if self.options.scheme == "int8" else None,
            calibration_source=self.calibration_source if self.options.scheme == "int8" else None,
        )

    @property
    def scheme(self) -> str:
        """The scheme asked for."""
        return self.options.scheme

    def program(self, target: str = "executorch") -> torch.export.ExportedProgram:
        """The quantized program `target` converts (made on its first call, then shared),
        not decomposed: PT2E's for ExecuTorch's `int8` / `int8_dynamic`, else torchao's
        (AOTInductor's `int8_dynamic` too)."""
        method = self._method(target)
        if method not in self._programs:
            if method == "pt2e":
                from engine.quantization import pt2e

                self._programs[method] = pt2e.quantize(
                    self.traced,
                    self.args,
                    self.kwargs,
                    dynamic=self.scheme == "int8_dynamic",
                    calibration=self.calibration,
                    dynamic_shapes=self.dynamic_shapes,
                    accept=self._accepts_module(),
                    fallbacks=self.fallbacks.setdefault(target, []),
                )
            else:
                self._programs[method] = self._torchao(self.pristine, method)
        return self._programs[method]

    def form_program(self, target: str, module: torch.nn.Module) -> torch.export.ExportedProgram:
        """The torchao-quantized program of `module`, `target`'s own form of the model
        (ExecuTorch's custom-op attention), made like `program`'s from `pristine` and not
        kept: the caller holds it, so a form the target refuses is freed at once. Not
        for the PT2E schemes (they quantize `traced`)."""
        method = self._method(target)
        assert method != "pt2e", "PT2E quantizes the traced program, not a form of it"
        return self._torchao(module, method)

    def _torchao(self, module: torch.nn.Module, method: str) -> torch.export.ExportedProgram:
        """A copy of `module` with its linears quantized by torchao, exported."""
        from engine.quantization import linears

        return linears.quantize(
            module,  # linears.quantize quantizes its own copy
            self.args,
            self.kwargs,
            scheme=self.scheme,
            group_size=self.options.group_size,
            dynamic_shapes=self.dynamic_shapes,
            strict=self.strict,
            float32=method == "torchao-float32",
        )

    def widens(self, target: str) -> bool:
        """Whether `target`'s program computes in float32 though the model does not."""
        return self._method(target) == "torchao-float32"

    def _method(self, target: str) -> str:
        """How `target`'s program is quantized: `pt2e`, `torchao` or `torchao-float32`
        (`onnxruntime`: ONNX quantizes its artifact, not a program)."""
        if target == "onnx":
            return "onnxruntime"
        if self.scheme in PT2E_SCHEMES and target == "executorch":
            return "pt2e"
        if target == "executorch" and reduced_model(self.pristine):
            return "torchao-float32"
        return "torchao"

    def converted(self, target: str) -> None:
        """`target` is converted: let go of the programs no target still to come needs
        (a 3B model's quantized program holds gigabytes while its artifact loads)."""
        self.pending.discard(target)
        needed = {self._method(each) for each in self.pending}
        for method in [each for each in self._programs if each not in needed]:
            del self._programs[method]

    def release(self) -> None:
        """Let go of the quantized programs (made again if asked for again)."""
        self._programs.clear()

    def accepts_outputs(self, expected: Any, actual: Any) -> bool:
        """Whether outputs `actual` are within the budget against float's `expected`."""
        return accuracy.agrees(self.options, expected, actual)

    def method(self, target: str) -> str | None:
        """How `target` was quantized (`report.quantization.targets[target].method`)."""
        method = METHODS.get((target, self.scheme))
        notes = self.fallbacks.get(target)
        if method and notes:
            return f"{method}; the full int8 missed the budget, so: {', '.join(notes)}"
        return method

    def _accepts_module(self) -> Any:
        """For static `int8`: whether a converted module is within the budget against the
        float program on the first four calibration samples."""
        if self.scheme != "int8":
            return None
        samples = self.calibration[: accuracy.CHECKED_SAMPLES]

        def run(module: Any, sample: Inputs) -> Any:
            sample_args, sample_kwargs = copy.deepcopy(sample)
            with torch.no_grad():
                return module(*sample_args, **sample_kwargs)

        float_module = self.traced.module()
        expected = [run(float_module, sample) for sample in samples]

        # The simulated quantization (Q/DQ pairs in float) runs a little closer to float
        # than XNNPACK's int8 kernels: it must stay within half the budget's error.
        strict = self.options.model_copy(
            update={
                "min_cosine": 1 - (1 - self.options.min_cosine) / 2,
                "max_abs": None if self.options.max_abs is None else self.options.max_abs / 2,
            }
        )

        def accept(converted: torch.fx.GraphModule) -> bool:
            return all(
                accuracy.agrees(strict, want, run(converted, sample))
                for want, sample in zip(expected, samples, strict=True)
            )

        return accept
