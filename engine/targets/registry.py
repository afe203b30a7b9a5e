"""The deployment targets, one row each: every fact about a target that code outside its
own module needs (its files, packages, install and failure hints, quantization schemes,
the programs its conversion runs, its module).

Torch-free, like the package's face (`engine.targets`): the worker's trusted side, the
environment report and the CLI read it without importing torch. Adding a target is a
module implementing `engine.targets.interface.Target` plus one row here;
tests/engine/test_target_registry.py checks the rows against the modules, the options'
`TargetName` and docs/targets.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ORDER",
    "TARGETS",
    "TARGET_ARTIFACTS",
    "TARGET_COMPANIONS",
    "TARGET_FILES",
    "TargetSpec",
    "spec",
]

_EXTRA = "pip install 'torchport[targets]'"
EXECUTORCH_INSTALL = (
    "pip install --no-deps executorch==1.4.1 torchao==0.18.0 and pip install "
    "ruamel.yaml==0.19.1 tabulate==0.10.0 (executorch's own dependency list would pull "
    "coremltools, pandas, scikit-learn and another torch)"
)


@dataclass(frozen=True)
class TargetSpec:
    """One deployment target's facts."""

    name: str
    """As option `targets` spells it."""
    module: str
    """The module implementing `engine.targets.interface.Target`."""
    artifact: str
    """The file it writes (`report.targets.<name>.artifact`)."""
    companions: tuple[str, ...] = ()
    """Files it may write beside the artifact (external weights, an encoder)."""
    encoder: str | None = None
    """An encoder-decoder model's encoder file (None: a method of the artifact, or none)."""
    requires: tuple[str, ...] = ()
    """Importable modules it needs besides torch."""
    import_check: str | None = None
    """The statement that shows those modules import (run in a fresh interpreter)."""
    install_hint: str = ""
    """What to install when the worker lacks them."""
    failure_hint: str = ""
    """The hint of a conversion that failed for no reason torchport recognized."""
    failed_op: str = ""
    """How a converter's refusal of one op reads: "aten.x.default <failed_op>"."""
    schemes: Mapping[str, str] = field(default_factory=dict)
    """Quantization schemes it takes → how each is quantized (`report.quantization`)."""
    toolchain: tuple[str, ...] = ()
    """Programs its conversion executes, by the name the toolchain broker knows them."""


TARGETS: dict[str, TargetSpec] = {
    row.name: row
    for row in (
        TargetSpec(
            name="onnx",
            module="engine.targets.onnx",
            artifact="model.onnx",
            companions=(
                "model.onnx.data",
                "genai_config.json",
                "encoder.onnx",
                "encoder.onnx.data",
            ),
            encoder="encoder.onnx",
            requires=("onnx", "onnxscript", "onnxruntime"),
            import_check="import onnx, onnxscript, onnxruntime",
            install_hint=f"Install the `targets` extra on the worker: {_EXTRA}.",
            failure_hint="The ONNX exporter has no translation for an op of this program, or "
            "a single-file model is over 2 GB (protobuf's limit: set onnx.external_data); see "
            "the message. program.pt2 is unaffected.",
            failed_op="has no ONNX translation",
            schemes={
                "int8": "onnxruntime quantize_static, QDQ, per-channel weights",
                "int8_dynamic": "onnxruntime quantize_dynamic, per-channel weights",
                "int4_weight_only": "onnxruntime MatMulNBitsQuantizer, 4-bit symmetric "
                "blocks of group_size weights, float32 compute (accuracy_level 1)",
                "8da4w": "onnxruntime MatMulNBitsQuantizer, 4-bit symmetric blocks of "
                "group_size weights, int8 compute (accuracy_level 4)",
            },
        ),
        TargetSpec(
            name="aoti",
            module="engine.targets.aoti",
            artifact="model.aoti.pt2",
            companions=("encoder.aoti.pt2",),
            encoder="encoder.aoti.pt2",
            install_hint="AOTInductor needs a C++ compiler (g++) on the worker.",
            failure_hint="AOTInductor could not compile or load this program; see the "
            "message. program.pt2 is unaffected.",
            failed_op="cannot be compiled by AOTInductor",
            # torchao's linear schemes: inductor compiles their quantize/dequantize ops into
            # the package. Not static `int8`: torch 2.13 has no CPU kernel for PT2E's
            # quantized graphs (`aten::quantized_max_pool2d` is QuantizedCPU-only).
            schemes={
                "int8_dynamic": "torchao quantize_ Int8DynamicActivationIntxWeightConfig("
                "int8, per channel) on linears",
                "int8_weight_only": "torchao quantize_ IntxWeightOnlyConfig(int8, per "
                "channel) on linears",
                "int4_weight_only": "torchao quantize_ IntxWeightOnlyConfig(int4, per group) "
                "on linears",
                "8da4w": "torchao quantize_ Int8DynamicActivationIntxWeightConfig(int4, per "
                "group) on linears",
            },
            toolchain=("g++",),
        ),
        TargetSpec(
            name="executorch",
            module="engine.targets.executorch",
            artifact="model.pte",
            requires=("executorch", "torchao", "ruamel.yaml", "flatbuffers", "tabulate"),
            import_check="import executorch.exir, executorch.runtime, torchao",
            install_hint=f"Install the `targets` extra on the worker ({_EXTRA}), then "
            f"{EXECUTORCH_INSTALL}.",
            failure_hint="ExecuTorch could not lower or run this program (an op without an "
            "ExecuTorch kernel, or a dynamic dim without an upper bound); see the message. "
            "program.pt2 is unaffected.",
            failed_op="has no ExecuTorch kernel",
            schemes={
                "int8": "pt2e XNNPACKQuantizer, static, per-channel symmetric weights",
                "int8_dynamic": "pt2e XNNPACKQuantizer, dynamic activations, per-channel "
                "symmetric weights",
                "int8_weight_only": "torchao quantize_ IntxWeightOnlyConfig(int8, per "
                "channel) on linears",
                "int4_weight_only": "torchao quantize_ IntxWeightOnlyConfig(int4, per group) "
                "on linears",
                "8da4w": "torchao quantize_ Int8DynamicActivationIntxWeightConfig(int4, per "
                "group) on linears",
            },
            toolchain=("flatc",),
        ),
    )
}
"""Every target, in the order a job converts them (whatever order the options name them in)."""

ORDER = tuple(TARGETS)
"""The target names in conversion order."""

TARGET_ARTIFACTS = {row.name: row.artifact for row in TARGETS.values()}
"""The file each target writes, by target name."""

TARGET_COMPANIONS = {row.name: row.companions for row in TARGETS.values() if row.companions}
"""Files a target may write beside its artifact (listed in its report entry's
`artifacts`): an ONNX model's external weights, an encoder-decoder model's encoder."""

TARGET_FILES = (
    *TARGET_ARTIFACTS.values(),
    *(name for names in TARGET_COMPANIONS.values() for name in names),
)
"""Every file name any target may write."""


def spec(name: str) -> TargetSpec:
    """Target `name`'s row.

    Raises:
        KeyError: no such target."""
    return TARGETS[name]
