"""The options `torchport export` and `torchport submit` share: what to upload, and how."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.targets.registry import ORDER, TARGET_ARTIFACTS
from torchport.tasks import contract_task


def model_source(value: str) -> Path | str:
    """MODEL as given: a path, or an `s3://` checkpoint reference kept as the string (a
    `Path` would fold its `//`)."""
    return value if value.startswith("s3://") else Path(value)


def add_upload_arguments(parser: argparse.ArgumentParser) -> None:
    """The model, its inputs, weights and calibration files, and the export options
    (docs/contract.md §8)."""
    parser.add_argument(
        "model",
        type=model_source,
        help="the model source: a .py file or a .zip, or a save_pretrained directory "
        "(zipped: config.json, generation_config.json and the weights); for submit also "
        "an s3:// prefix holding one, under a prefix the server allow-lists",
    )
    parser.add_argument(
        "--task",
        help="for a checkpoint: the task to export for, e.g. fill-mask, text-generation; "
        "optimum's names (text-generation-with-past, causal-lm, …) are taken too "
        "(default: inferred from config.architectures)",
    )
    parser.add_argument(
        "--max-cache-len",
        type=int,
        metavar="N",
        help="for a checkpoint that generates (text-generation, text2text-generation): "
        "tokens its static KV cache holds, 32 to "
        "8192 (sets the options' generation.max_cache_len; default 1024, or the model's "
        "context when shorter)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        metavar="N",
        help="for a checkpoint that generates: tokens generated greedily to check each "
        "artifact against eager transformers, 1 to 256 (sets the options' "
        "generation.max_new_tokens; default 16)",
    )
    parser.add_argument(
        "--adapter",
        type=Path,
        metavar="DIR",
        help="for a checkpoint directory: the PEFT adapter directory (adapter_config.json, "
        "adapter_model.safetensors) to merge before export, sent in the zip instead of the "
        "checkpoint's own adapter sub-folders",
    )
    parser.add_argument("--inputs", type=Path, help="example inputs: .safetensors, .pt or .json")
    parser.add_argument("--weights", type=Path, help="state dict: .safetensors, .pt or .pth")
    parser.add_argument(
        "--calibration",
        type=Path,
        help="calibration inputs for --quantize int8: a list of example inputs as "
        ".safetensors, .pt or .json (default: the example and the verification samples)",
    )
    parser.add_argument("--options", help="export options: JSON text or a .json file")
    parser.add_argument("--dynamic-shapes", help="dynamic shapes: JSON text or a .json file")
    parser.add_argument("--strict", action="store_true", help="trace with strict=True")
    parser.add_argument(
        "--requires",
        action="append",
        metavar="SPEC",
        help="a pip-style requirement the worker must meet, e.g. 'transformers>=4.40' "
        "(repeatable; added to the options' requires)",
    )
    parser.add_argument(
        "--target",
        action="append",
        choices=ORDER,
        help="also produce and verify a deployment artifact: "
        + ", ".join(f"{name} ({artifact})" for name, artifact in TARGET_ARTIFACTS.items())
        + " (repeatable; docs/targets.md)",
    )
    parser.add_argument(
        "--targets-required",
        action="store_true",
        help="fail the export when a target fails (default: a warning)",
    )
    parser.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="quantize the targets: int8, int8_dynamic, int8_weight_only, int4_weight_only "
        "or 8da4w (sets the options' quantize.scheme; accuracy vs float in the summary; "
        "docs/targets.md)",
    )
    parser.add_argument(
        "--profile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="profile every artifact on the worker: latency at 1 thread and all threads, "
        "load time, memory, size (default: on with targets; sets the options' "
        "profile.enabled)",
    )


def requires_of(args: argparse.Namespace, options: dict[str, Any]) -> None:
    """Add the `--requires` of the command line to the options' `requires`, its
    `--target`s to the options' `targets`, `--task` as the options' `task` (optimum's
    name of a task as the contract's), `--max-cache-len` and `--max-new-tokens` to
    `generation`, `--profile`/`--no-profile` as `profile.enabled`, `--quantize` as
    `quantize.scheme`.

    Raises:
        UnknownTask: `--task` names no task (its `body` is the usage error).
    """
    if args.task:
        options["task"] = contract_task(args.task)
    flags = {"max_cache_len": args.max_cache_len, "max_new_tokens": args.max_new_tokens}
    chosen = {key: value for key, value in flags.items() if value is not None}
    generation = options.get("generation", {})
    # Anything but an object is left as it is, for the options' validation to refuse.
    if chosen and isinstance(generation, dict):
        options["generation"] = {**generation, **chosen}
    if args.target:
        existing = options.get("targets", [])
        if isinstance(existing, list):
            options["targets"] = [*existing, *(t for t in args.target if t not in existing)]
    if args.targets_required:
        options["targets_required"] = True
    if args.profile is not None:
        profile = options.get("profile", {})
        # Anything but an object is left as it is, for the options' validation to refuse.
        if isinstance(profile, dict):
            options["profile"] = {**profile, "enabled": args.profile}
    if args.quantize is not None:
        quantize = options.get("quantize", {})
        # Anything but an object is left as it is, for the options' validation to refuse.
        if isinstance(quantize, dict):
            options["quantize"] = {**quantize, "scheme": args.quantize}
    if args.requires:
        existing = options.get("requires", [])
        # Anything but a list is left as it is, for the options' validation to refuse.
        if isinstance(existing, list):
            options["requires"] = [*existing, *args.requires]
