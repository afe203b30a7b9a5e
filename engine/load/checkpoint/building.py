"""Building the model of a checkpoint upload for its task, and its example inputs.

The config is read with `AutoConfig`, the task chosen (`tasks`), the model built by the
task's auto class with `from_pretrained` from the unpacked directory, offline:
safetensors weights (one file or shards with `model.safetensors.index.json`) are read
without pickle; only a checkpoint without safetensors falls back to `pytorch_model.bin`
(read by transformers with `torch.load(weights_only=True)`), and a checkpoint whose
code is in the zip (`auto_map`) is imported with `trust_remote_code`. Both happen here,
in the engine, which the services only run inside the sandbox. A PEFT adapter in a
sub-folder (`adapters`) is merged into the model before its inputs are made.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from engine.diagnostics.source_map import SourceMap
from engine.environment import libraries as library_index
from engine.errors import (
    EagerRunFailed,
    InvalidInputs,
    InvalidRequest,
    ModelImportFailed,
    ModelNotFound,
    WeightsMismatch,
)
from engine.generation import Generation, make_ready, make_seq2seq_ready
from engine.load.checkpoint import tokenizer
from engine.load.checkpoint.adapters import find_adapter, merge_adapter
from engine.load.checkpoint.detection import CONFIG
from engine.load.checkpoint.example_inputs import max_sequence, task_inputs
from engine.load.checkpoint.in_archive import Kept, archived, state_dict, unpack_all
from engine.load.checkpoint.tasks import TaskChoice, choose_task, supported_tasks
from engine.load.eager import prepare
from engine.load.inputs import read_inputs
from engine.load.model import LoadedModel, Upload
from schemas import AdapterReport, CheckpointReport, ExportOptions, ReportWarning

__all__ = ["load_checkpoint"]

STAGE = "loading"
MAX_LISTED = 50


def load_checkpoint(
    upload: Upload,
    options: ExportOptions,
    directory: Path,
    source_map: SourceMap,
    *,
    reference: bool,
    libraries: dict[str, str] | None,
) -> LoadedModel:
    """Load the checkpoint unpacked at `directory` as the loading stage loads code.

    Raises:
        ExportError: `model_import_failed` (transformers missing), `model_not_found`
            (config unreadable, model type or architecture unknown), `invalid_request`
            (a task the architecture cannot do: `details.supported_tasks`; an adapter
            not found, ambiguous or not mergeable), `environment_mismatch` (an adapter
            without peft), `invalid_inputs` (no weights, unreadable weights or adapter),
            `weights_mismatch` (also an adapter that does not fit), `eager_run_failed`.
    """
    before = set(sys.modules)
    adapter: AdapterReport | None = None
    try:
        model, config, choice, loading_info, adapter = _build(directory, options)
    finally:
        if libraries is not None:
            libraries.update(library_index.imported_libraries(before))
            # imported earlier (the zygote preloads transformers): still what built it
            for name in ("transformers", "peft") if adapter is not None else ("transformers",):
                version = getattr(sys.modules.get(name), "__version__", None)
                if version:
                    libraries[name] = str(version)
    generated = upload.inputs is None
    generation: Generation | None = None
    not_ready: list[ReportWarning] = []
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = {}
    dynamic_shapes: dict[str, Any] | None = None
    if generated and _generation_ready(choice, options):
        try:
            if choice.task == "text-generation":
                ready = make_ready(model, config, options.generation)
            else:
                ready = make_seq2seq_ready(model, config, options.generation, max_sequence(config))
        except ModelNotFound as exc:
            # the task still exports, as its plain forward: unless the user asked for the
            # cache by name, that program with a warning beats failing the job
            if exc.details.get("reason") != "no_static_cache":
                raise
            if options.generation.cache:  # asked for by name
                raise
            config.use_cache = False  # the logits alone, no cache object to return
            own = getattr(model, "config", None)  # transformers' may be another object
            if own is not None:
                own.use_cache = False
            not_ready.append(_no_cache(config, exc))
        else:
            model, generation, made_kwargs, dynamic_shapes = ready
            kwargs = dict(made_kwargs)
    if generation is None and upload.inputs is None:
        made = task_inputs(choice.task, model, config)
        kwargs = dict(made.kwargs)
        dynamic_shapes = made.dynamic_shapes
    elif generation is None and upload.inputs is not None:
        args, kwargs = read_inputs(upload.inputs)
        dynamic_shapes = None
        if choice.loader.auto_class in SEQ2SEQ_CLASSES:
            config.use_cache = False  # the plain forward on the user's inputs, as before
    try:
        prepared = prepare(
            model,
            args,
            kwargs,
            weights=upload.weights,
            options=options,
            source_map=source_map,
            reference=reference,
        )
    except EagerRunFailed as exc:
        if generated:
            generated_inputs_failed(exc, choice.task)
        raise
    report = CheckpointReport(
        task=choice.task,
        task_source=choice.source,
        model_type=config.model_type,
        architecture=(config.architectures or [None])[0],
        model_class=type(model if generation is None else generation.model).__name__,
        weights_format=_weights_format(directory),
        weights_files=_weights_files(directory),
        remote_code=bool(getattr(config, "auto_map", None)),
        newly_initialized=sorted(loading_info.get("missing_keys", ()))[:MAX_LISTED],
        generated_inputs=generated,
        adapter=adapter,
        tokenizer_files=tokenizer.found(directory),
    )
    return LoadedModel(
        module=model,
        args=prepared.args,
        kwargs=prepared.kwargs,
        source_map=source_map,
        entry=CONFIG,
        module_name=type(model).__module__,
        module_dynamic_shapes=dynamic_shapes,
        dynamic_shapes_source="checkpoint",
        eager_outputs=prepared.outputs,
        eager_buffers=prepared.buffers,
        device=options.device,
        weights=prepared.weights,
        warnings=[*not_ready, *prepared.warnings],
        checkpoint=report,
        checkpoint_dir=directory,
        generation=generation,
        strict=False if generation is not None else None,
    )


SEQ2SEQ_CLASSES = frozenset({"AutoModelForSeq2SeqLM", "AutoModelForSpeechSeq2Seq"})
"""Auto classes of encoder-decoder models, made generation-ready as two programs."""


def generated_inputs_failed(exc: EagerRunFailed, task: str) -> None:
    """`exc`, a failure of the eager run on the inputs torchport made for `task`, says so
    (`details.inputs` `generated`) with a hint to upload inputs instead."""
    if "reason" not in exc.details:  # not `weights_changed`: the inputs may be at fault
        exc.hint = _GENERATED_INPUTS_HINT
        exc.details = {**exc.details, "inputs": "generated", "task": task}


_GENERATED_INPUTS_HINT = (
    "The example inputs were torchport's, built from the checkpoint's config for its task "
    "(`report.inputs` has their names and shapes), and the model refused them: upload "
    "an inputs file of your own (`--inputs`: `.safetensors` with `kwargs.<name>` tensors, "
    "`.pt` or a `.json` spec, contract section 3) with the shapes the model takes, or "
    "name another `task`."
)


def _no_cache(config: Any, exc: ModelNotFound) -> ReportWarning:
    """Warning `generation_not_ready`: the plain forward, since transformers cannot give
    the model a static cache."""
    return ReportWarning(
        code="generation_not_ready",
        message=(
            f"transformers cannot give a {config.model_type} model a static KV cache "
            "(hybrid, state-space and linear-attention models keep other state), so the "
            "program is the model's plain forward: it computes the logits of a whole "
            "sequence and carries no cache between steps. Set generation.cache to false "
            "to ask for this program without the warning."
        ),
        details={
            "reason": "no_static_cache",
            "model_type": str(config.model_type),
            "exception": exc.details.get("exception"),
        },
    )


def _generation_ready(choice: TaskChoice, options: ExportOptions) -> bool:
    """Whether the task's model is exported with a KV cache: a decoder-only LM, or an
    encoder-decoder one (text2text, speech-to-text), unless `generation.cache` is off."""
    if options.generation.cache is False:
        return False
    return choice.task == "text-generation" or choice.loader.auto_class in SEQ2SEQ_CLASSES


def _transformers() -> Any:
    import transformers

    return transformers


def _build(
    directory: Path, options: ExportOptions
) -> tuple[torch.nn.Module, Any, TaskChoice, dict[str, Any], AdapterReport | None]:
    try:
        transformers = _transformers()
    except ImportError as exc:
        raise ModelImportFailed(
            "A checkpoint upload needs transformers, which this worker cannot import.",
            hint="Export checkpoints on workers that have transformers (see `torchport env`).",
            stage=STAGE,
            details={"exception": type(exc).__name__, "missing_module": "transformers"},
        ) from exc
    transformers.utils.logging.disable_progress_bar()
    raw = _read_config(directory)
    found = raw.get("auto_map")
    auto_map: dict[str, Any] = found if isinstance(found, dict) else {}
    remote = bool(auto_map)
    try:
        config = transformers.AutoConfig.from_pretrained(
            str(directory), trust_remote_code=remote, local_files_only=True
        )
    except Exception as exc:
        raise ModelNotFound(
            f"The checkpoint's config.json cannot be read as a transformers config: "
            f"{type(exc).__name__}: {source_text(exc, directory)}",
            hint="Upload a directory written by `save_pretrained` with a transformers "
            "version the workers have (see `torchport env`), or name the version in "
            "`requires`.",
            stage=STAGE,
            details={
                "reason": "unknown_model_type",
                "model_type": raw.get("model_type"),
                "exception": type(exc).__name__,
            },
        ) from exc
    architectures = list(getattr(config, "architectures", None) or [])
    tasks = supported_tasks(config.model_type, auto_map)
    if options.task is not None and options.task not in tasks:
        raise InvalidRequest(
            f"A {config.model_type} checkpoint cannot be exported for the task {options.task}.",
            hint="Choose one of the tasks it supports: " + ", ".join(tasks) + "."
            if tasks
            else "transformers builds no model of this type for any task torchport exports.",
            stage=STAGE,
            details={
                "reason": "task_not_supported",
                "task": options.task,
                "model_type": config.model_type,
                "architectures": architectures,
                "supported_tasks": tasks,
            },
        )
    adapter = find_adapter(directory, options.adapter)
    choice = choose_task(
        options.task, config.model_type, architectures, auto_map, adapter.task if adapter else None
    )
    if choice is None:
        raise ModelNotFound(
            "No task can be inferred from the checkpoint's architectures "
            f"({', '.join(architectures) or 'none'}).",
            hint="Name the task with the `task` option"
            + (": one of " + ", ".join(tasks) + "." if tasks else "."),
            stage=STAGE,
            details={
                "reason": "unknown_architecture",
                "model_type": config.model_type,
                "architectures": architectures,
                "supported_tasks": tasks,
            },
        )
    if not _generation_ready(choice, options) and (
        choice.task == "text-generation" or choice.loader.auto_class in SEQ2SEQ_CLASSES
    ):
        config.use_cache = False  # the plain forward (logits); no KV cache
    auto_class = getattr(transformers, choice.loader.auto_class)
    model, info = _from_pretrained(auto_class, directory, config, remote)
    if adapter is None:
        return model.eval(), config, choice, info, None
    model, report = merge_adapter(model, adapter, lambda exc: source_text(exc, directory))
    # a head the adapter holds whole (`modules_to_save`) was not left at random
    info["missing_keys"] = [
        key
        for key in info.get("missing_keys", ())
        if not any(_under(key, module) for module in report.modules_to_save)
    ]
    return model, config, choice, info, report


def _under(key: str, module: str) -> bool:
    """Whether the parameter `key` (`score.weight`) belongs to a module named `module`."""
    return f".{module}." in f".{key.rsplit('.', 1)[0]}."


def _from_pretrained(
    auto_class: Any, directory: Path, config: Any, remote: bool
) -> tuple[torch.nn.Module, dict[str, Any]]:
    use_safetensors = _weights_format(directory) == "safetensors"
    if not _weights_files(directory):
        raise InvalidInputs(
            "The checkpoint holds no weights (no *.safetensors, no pytorch_model.bin).",
            hint="Zip the whole `save_pretrained` directory, with its model.safetensors "
            "(or its shards and model.safetensors.index.json).",
            stage=STAGE,
            details={"source": "checkpoint", "reason": "no_weights"},
        )
    kept = archived(directory)
    if kept and (remote or any(directory.glob("*.safetensors"))):
        unpack_all(directory)  # remote code, or some weights unpacked: load them all as files
        kept = {}
    try:
        if kept:  # the weights mapped where they lie in the zip (`in_archive`)
            model, info = _from_state_dict(auto_class, directory, config, kept)
        else:
            model, info = auto_class.from_pretrained(
                str(directory),
                config=config,
                local_files_only=True,
                use_safetensors=use_safetensors,
                trust_remote_code=remote,
                output_loading_info=True,
            )
    except Exception as exc:
        text = source_text(exc, directory)
        if "size mismatch" in text or "mismatched" in text.lower():
            raise WeightsMismatch(
                f"The checkpoint's weights do not fit its config: {text}",
                stage=STAGE,
                details={"source": "checkpoint", "exception": type(exc).__name__},
            ) from exc
        raise InvalidInputs(
            f"The checkpoint's weights cannot be loaded: {type(exc).__name__}: {text}",
            stage=STAGE,
            details={
                "source": "checkpoint",
                "reason": "unreadable_weights",
                "exception": type(exc).__name__,
            },
        ) from exc
    return model, dict(info)


def _from_state_dict(
    auto_class: Any, directory: Path, config: Any, kept: dict[str, Kept]
) -> tuple[torch.nn.Module, Any]:
    """`from_pretrained` from the weights kept in the zip, as from the directory: the
    auto class's model class for the config, and the directory's generation config."""
    model_class = auto_class._model_mapping[type(config)]
    model, info = model_class.from_pretrained(
        None,
        config=config,
        state_dict=state_dict(list(kept.values())),
        output_loading_info=True,
    )
    if model.can_generate() and (directory / "generation_config.json").is_file():
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(
            str(directory), local_files_only=True
        )
    return model, info


def source_text(exc: BaseException, directory: Path) -> str:
    """The exception's text without the job's directory (a server path)."""
    return str(exc).replace(str(directory) + "/", "").replace(str(directory), ".")[:2000]


def _read_config(directory: Path) -> dict[str, Any]:
    try:
        raw = json.loads((directory / CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelNotFound(
            "The checkpoint's config.json is not a JSON object.",
            stage=STAGE,
            details={"reason": "bad_config", "exception": type(exc).__name__},
        ) from exc
    if not isinstance(raw, dict):
        raise ModelNotFound(
            "The checkpoint's config.json is not a JSON object.",
            stage=STAGE,
            details={"reason": "bad_config", "got": type(raw).__name__},
        )
    return raw


def _weights_files(directory: Path) -> list[str]:
    safetensors = sorted(
        {p.name for p in directory.glob("*.safetensors")} | set(archived(directory))
    )
    if safetensors:
        return safetensors
    return sorted(p.name for p in directory.glob("pytorch_model*.bin"))


def _weights_format(directory: Path) -> str:
    kept = any(directory.glob("*.safetensors")) or archived(directory)
    return "safetensors" if kept else "pytorch_bin"
