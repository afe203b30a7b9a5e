"""PEFT adapters beside a checkpoint: found, read, and merged into its model before export.

A checkpoint zip may hold a PEFT adapter in a sub-folder of its base level, as
`PeftModel.save_pretrained` writes it (`adapter_config.json`, `adapter_model.safetensors`):
the option `adapter` names the folder, else the one sub-folder with an
`adapter_config.json` is it. The model built from the checkpoint takes the adapter with
`PeftModel.from_pretrained` and keeps it merged (`merge_and_unload`), so the program holds
the model's own modules with the merged weights. Offline, safetensors only; peft is
imported only when there is an adapter (`environment_mismatch` where it cannot be).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

import torch

from engine.environment import libraries as library_index
from engine.errors import (
    EnvironmentMismatch,
    ExportError,
    InvalidInputs,
    InvalidRequest,
    WeightsMismatch,
)
from engine.load.checkpoint.detection import ADAPTER_CONFIG, ADAPTER_WEIGHTS
from schemas import AdapterReport

__all__ = ["Adapter", "find_adapter", "merge_adapter", "refuse_adapter_only"]

STAGE = "loading"
MAX_LISTED = 50

TASK_TYPES = {
    "CAUSAL_LM": "text-generation",
    "SEQ_CLS": "text-classification",
    "TOKEN_CLS": "token-classification",
    "QUESTION_ANS": "question-answering",
    "SEQ_2_SEQ_LM": "text2text-generation",
    "FEATURE_EXTRACTION": "feature-extraction",
}
"""peft's `task_type` → the task (schemas.TaskName) whose model the adapter was made for."""


@dataclass(frozen=True)
class Adapter:
    """An adapter folder of the checkpoint and its `adapter_config.json`."""

    directory: Path
    path: str
    """The folder relative to the checkpoint's `config.json`, as the report names it."""
    selected_by: Literal["options", "only_folder"]
    config: dict[str, Any]

    @property
    def task(self) -> str | None:
        """The task of the adapter's `task_type`, if peft names one."""
        return TASK_TYPES.get(str(self.config.get("task_type")))


def find_adapter(directory: Path, requested: str | None) -> Adapter | None:
    """The adapter of the checkpoint unpacked at `directory`: the folder `requested`
    names, else its one sub-folder with an `adapter_config.json`; None when there is none.

    Raises:
        InvalidRequest: `adapter_not_found` (the named folder holds no adapter),
            `several_adapters` (several sub-folders do, none named).
        InvalidInputs: `bad_adapter_config`, `no_adapter_weights`.
    """
    available = sorted(
        p.name for p in directory.iterdir() if p.is_dir() and (p / ADAPTER_CONFIG).is_file()
    )
    if requested is not None:
        folder = directory / requested
        if not (folder / ADAPTER_CONFIG).is_file() or not folder.resolve().is_relative_to(
            directory.resolve()
        ):
            raise InvalidRequest(
                f"The adapter folder {requested!r} named in the options holds no {ADAPTER_CONFIG}.",
                hint="Name the folder of the zip that holds the adapter, relative to "
                "config.json" + (": one of " + ", ".join(available) + "." if available else "."),
                stage=STAGE,
                details={
                    "reason": "adapter_not_found",
                    "adapter": requested,
                    "available": available[:MAX_LISTED],
                },
            )
        return _adapter(folder, requested, "options")
    if not available:
        return None
    if len(available) > 1:
        raise InvalidRequest(
            f"The checkpoint holds {len(available)} adapters ({', '.join(available)}); "
            "which one to merge is not said.",
            hint="Name the adapter's folder with the `adapter` option (the CLI's `--adapter`), "
            "or upload one adapter.",
            stage=STAGE,
            details={"reason": "several_adapters", "adapters": available[:MAX_LISTED]},
        )
    return _adapter(directory / available[0], available[0], "only_folder")


def _adapter(folder: Path, path: str, selected_by: Literal["options", "only_folder"]) -> Adapter:
    config = _read_adapter_config(folder, path)
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise _failure(
            InvalidInputs,
            path,
            "no_adapter_weights",
            f"The adapter folder {path!r} holds no {ADAPTER_WEIGHTS}.",
            "Save the adapter with `save_pretrained` (safetensors, its default) and zip its "
            "adapter_model.safetensors beside adapter_config.json; pickled adapter_model.bin "
            "files are not read.",
            files=sorted(p.name for p in folder.iterdir())[:MAX_LISTED],
        )
    return Adapter(folder, path, selected_by, config)


def _read_adapter_config(folder: Path, path: str) -> dict[str, Any]:
    try:
        raw = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _bad_config(path, f"{type(exc).__name__}: {exc}", exc) from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("peft_type"), str):
        raise _bad_config(path, "not a JSON object with a peft_type")
    return raw


def _failure(
    kind: type[ExportError],
    path: str,
    reason: str,
    message: str,
    hint: str,
    exc: BaseException | None = None,
    **details: Any,
) -> ExportError:
    """An adapter's error: `details` with `source` `adapter`, the `reason`, the folder
    (`adapter`) and the exception's type."""
    found = {"exception": type(exc).__name__} if exc is not None else {}
    return kind(
        message,
        hint=hint,
        stage=STAGE,
        details={"source": "adapter", "reason": reason, "adapter": path, **details, **found},
    )


def _bad_config(path: str, problem: str, exc: BaseException | None = None) -> ExportError:
    return _failure(
        InvalidInputs,
        path,
        "bad_adapter_config",
        f"The adapter's {ADAPTER_CONFIG} ({path}) cannot be read as a peft config: {problem}",
        "Upload the adapter folder as `PeftModel.save_pretrained` writes it, with a peft "
        "version the workers have (see `torchport env`).",
        exc,
    )


def refuse_adapter_only(directory: Path) -> NoReturn:
    """Refuse a zip holding an adapter at `directory` but not its base checkpoint.

    Raises:
        InvalidRequest: `adapter_without_base`, with the adapter's
            `base_model_name_or_path` when its config names one.
    """
    try:
        raw = json.loads((directory / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raw = None
    base = raw.get("base_model_name_or_path") if isinstance(raw, dict) else None
    raise InvalidRequest(
        "The zip holds a PEFT adapter but not the base checkpoint it adapts"
        + (f" ({base})." if isinstance(base, str) else "."),
        hint="torchport does not download models: zip the base's save_pretrained files "
        "(config.json and weights) with the adapter in a sub-folder beside them, e.g. "
        "`torchport export BASE_DIR --adapter ADAPTER_DIR`.",
        stage=STAGE,
        details={
            "reason": "adapter_without_base",
            "base_model_name_or_path": base if isinstance(base, str) else None,
        },
    )


def _peft() -> Any:
    try:
        import peft
        import peft.tuners.tuners_utils
    except ImportError as exc:
        installed = library_index.check_requirements(["peft"])[0].installed
        raise EnvironmentMismatch(
            "The checkpoint holds a PEFT adapter; merging it needs peft, which this worker "
            "cannot import.",
            hint="Export adapters on workers that have peft (the `models` extra; see "
            "`torchport env`), or merge it yourself (`merge_and_unload()`, then "
            "`save_pretrained`) and upload the merged checkpoint.",
            stage=STAGE,
            details={
                "reason": "adapter_needs_peft",
                "missing_module": "peft",
                "exception": type(exc).__name__,
                "requirements": [
                    {"requirement": "peft", "name": "peft", "installed": installed, "met": False}
                ],
                "unmet": ["peft"],
            },
        ) from exc
    return peft


def merge_adapter(
    model: torch.nn.Module, adapter: Adapter, text: Callable[[BaseException], str]
) -> tuple[torch.nn.Module, AdapterReport]:
    """`model` with `adapter` merged into its weights, and what the report says of it;
    `text(exc)` is an exception's text without server paths.

    Raises:
        EnvironmentMismatch: peft cannot be imported.
        InvalidInputs: `bad_adapter_config`, `unreadable_adapter`.
        InvalidRequest: `adapter_not_mergeable` (prompt learning and other adapters that
            add no weights to merge).
        WeightsMismatch: `adapter_target_not_found`, `adapter_shape_mismatch`,
            `adapter_keys_missing`.
    """
    peft = _peft()
    try:
        config = peft.PeftConfig.from_pretrained(str(adapter.directory))
    except Exception as exc:
        raise _bad_config(adapter.path, f"{type(exc).__name__}: {text(exc)}", exc) from exc
    if config.is_prompt_learning:
        raise _not_mergeable(adapter)
    try:
        peft_model = peft.PeftModel.from_pretrained(
            model, str(adapter.directory), config=config, is_trainable=False
        )
    except Exception as exc:
        raise _load_failure(adapter, exc, text(exc)) from exc
    _check_keys(peft, peft_model, adapter)
    tuner = peft.tuners.tuners_utils.BaseTunerLayer
    adapted = sum(isinstance(module, tuner) for module in peft_model.modules())
    try:
        merged = peft_model.merge_and_unload()
    except Exception as exc:
        raise _not_mergeable(adapter, exc) from exc
    config_of = adapter.config.get
    report = AdapterReport(
        path=adapter.path,
        selected_by=adapter.selected_by,
        peft_type=str(config_of("peft_type")),
        task_type=_string(config_of("task_type")),
        r=_number(config_of("r"), int),
        alpha=_number(config_of("lora_alpha", config_of("alpha")), float),
        target_modules=_target_modules(config_of("target_modules")),
        modules_to_save=_names(config_of("modules_to_save")),
        adapted_modules=adapted,
        base_model_name_or_path=_string(config_of("base_model_name_or_path")),
    )
    return merged.eval(), report


def _string(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: Any, kind: type) -> Any:
    return kind(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _names(value: Any) -> list[str]:
    return sorted(str(v) for v in value) if isinstance(value, list | tuple | set) else []


def _target_modules(value: Any) -> list[str] | str | None:
    return _names(value) if isinstance(value, list | tuple | set) else _string(value)


def _not_mergeable(adapter: Adapter, exc: BaseException | None = None) -> ExportError:
    kind = str(adapter.config["peft_type"])
    return _failure(
        InvalidRequest,
        adapter.path,
        "adapter_not_mergeable",
        f"The {kind} adapter ({adapter.path}) cannot be merged into the model's weights.",
        "Only adapters that change weights (LoRA, LoHa, LoKr, IA³, OFT, …) are merged before "
        "export; export the base checkpoint, or the model with its adapter as a model.py "
        "upload.",
        exc,
        peft_type=kind,
    )


def _load_failure(adapter: Adapter, exc: BaseException, text: str) -> ExportError:
    if type(exc).__name__ == "NoMatchingPeftModuleError" or "not found in the base model" in text:
        return _failure(
            WeightsMismatch,
            adapter.path,
            "adapter_target_not_found",
            f"The adapter ({adapter.path}) targets modules the checkpoint's model does not "
            f"have: {text}",
            "Upload the adapter with the base checkpoint it was trained on (its "
            "adapter_config.json names it in base_model_name_or_path).",
            exc,
            target_modules=_target_modules(adapter.config.get("target_modules")),
        )
    if "size mismatch" in text:
        return _failure(
            WeightsMismatch,
            adapter.path,
            "adapter_shape_mismatch",
            f"The adapter's weights ({adapter.path}) do not fit the checkpoint's model or the "
            f"adapter's own config: {text}",
            "Upload the adapter with the base checkpoint it was trained on, and its own "
            "adapter_config.json (its `r` must be the rank of its weights).",
            exc,
        )
    return _failure(
        InvalidInputs,
        adapter.path,
        "unreadable_adapter",
        f"The adapter ({adapter.path}) cannot be loaded: {type(exc).__name__}: {text}",
        "Upload the adapter folder as `PeftModel.save_pretrained` writes it, with a peft "
        "version the workers have (see `torchport env`).",
        exc,
    )


def _check_keys(peft: Any, peft_model: Any, adapter: Adapter) -> None:
    """peft only warns when the adapter's file lacks weights its config asks for (and
    leaves them at their initial values): refuse that."""
    from safetensors import safe_open

    with safe_open(str(adapter.directory / ADAPTER_WEIGHTS), framework="pt") as weights:
        saved = set(weights.keys())
    expected = peft.get_peft_model_state_dict(peft_model, save_embedding_layers=False)
    missing = sorted(set(expected) - saved)
    if missing:
        raise _failure(
            WeightsMismatch,
            adapter.path,
            "adapter_keys_missing",
            f"The adapter's weights ({adapter.path}) lack {len(missing)} tensors its config "
            "asks for.",
            "Upload the adapter_model.safetensors that `save_pretrained` wrote with this "
            "adapter_config.json.",
            missing=missing[:MAX_LISTED],
        )
