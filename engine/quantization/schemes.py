"""Which target takes which quantization scheme, and how (torch-free: the service and the
CLI may describe it without importing torch)."""

from __future__ import annotations

from typing import Any

from engine.targets.registry import TARGETS

__all__ = ["METHODS", "TARGET_SCHEMES", "refusal", "takes"]

TARGET_SCHEMES: dict[str, tuple[str, ...]] = {
    row.name: tuple(row.schemes) for row in TARGETS.values()
}
"""The schemes each target can take (its registry row's `schemes`)."""

METHODS: dict[tuple[str, str], str] = {
    (row.name, scheme): method for row in TARGETS.values() for scheme, method in row.schemes.items()
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
