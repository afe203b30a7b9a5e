"""Which target takes which quantization scheme, and how (torch-free: the service and the
CLI may describe it without importing torch)."""

from __future__ import annotations

from typing import Any

__all__ = ["METHODS", "TARGET_SCHEMES", "refusal", "takes"]

TARGET_SCHEMES: dict[str, tuple[str, ...]] = {
    "executorch": ("int8", "int8_dynamic", "int8_weight_only", "int4_weight_only", "8da4w"),
    "onnx": ("int8", "int8_dynamic"),
    "aoti": ("int8_dynamic", "int8_weight_only", "int4_weight_only", "8da4w"),
}
"""The schemes each target can take. AOTInductor takes torchao's linear schemes (inductor
compiles their quantize/dequantize ops into the package: it runs with torch alone), its
`int8_dynamic` being torchao's 8-bit dynamic activations with per-channel int8 weights;
not static `int8`: it has no CPU kernel for PT2E's quantized graphs in torch 2.13 (the
int8 max-pool runs as `aten::quantized_max_pool2d`, a QuantizedCPU-only kernel)."""

METHODS: dict[tuple[str, str], str] = {
    ("executorch", "int8"): "pt2e XNNPACKQuantizer, static, per-channel symmetric weights",
    ("executorch", "int8_dynamic"): "pt2e XNNPACKQuantizer, dynamic activations, "
    "per-channel symmetric weights",
    ("executorch", "int8_weight_only"): "torchao quantize_ IntxWeightOnlyConfig(int8, "
    "per channel) on linears",
    ("executorch", "int4_weight_only"): "torchao quantize_ IntxWeightOnlyConfig(int4, "
    "per group) on linears",
    ("executorch", "8da4w"): "torchao quantize_ Int8DynamicActivationIntxWeightConfig(int4, "
    "per group) on linears",
    ("aoti", "int8_dynamic"): "torchao quantize_ Int8DynamicActivationIntxWeightConfig(int8, "
    "per channel) on linears",
    ("aoti", "int8_weight_only"): "torchao quantize_ IntxWeightOnlyConfig(int8, per channel) "
    "on linears",
    ("aoti", "int4_weight_only"): "torchao quantize_ IntxWeightOnlyConfig(int4, per group) "
    "on linears",
    ("aoti", "8da4w"): "torchao quantize_ Int8DynamicActivationIntxWeightConfig(int4, per "
    "group) on linears",
    ("onnx", "int8"): "onnxruntime quantize_static, QDQ, per-channel weights",
    ("onnx", "int8_dynamic"): "onnxruntime quantize_dynamic, per-channel weights",
}
"""How each (target, scheme) is quantized, as `report.quantization.targets[name].method`."""


def takes(target: str, scheme: str) -> bool:
    """Whether `target` can take `scheme` (every target takes `none`)."""
    return scheme == "none" or scheme in TARGET_SCHEMES.get(target, ())


def refusal(target: str, scheme: str) -> tuple[str, str, dict[str, Any]]:
    """The message, hint and details of `target_failed` for a scheme `target` cannot take:
    the hint names the schemes it can."""
    schemes = ["none", *TARGET_SCHEMES.get(target, ())]
    return (
        f"{target} cannot take quantization scheme {scheme}",
        f"{target} takes quantize.scheme {' | '.join(schemes)}; pick one of those, or leave "
        f"{target} out of targets.",
        {"reason": "scheme_unsupported", "scheme": scheme, "schemes": schemes},
    )
