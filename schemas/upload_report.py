"""The parts of `report.json` about what was uploaded: the example inputs as loaded, the
weights file, the checkpoint and the adapter merged into it, and what the program holds
(re-exported by `schemas.report`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas._base import StrictModel


class InputSummary(StrictModel):
    """One example input as loaded, before tracing: a leaf of `(args, kwargs)`."""

    path: str = Field(
        description="Pytree path into the inputs: `args[0]`, `kwargs['mask']`, `args[1]['a']`."
    )
    name: str | None = Field(
        default=None,
        description="forward's parameter the top-level argument binds to (the key itself "
        "for a `**kwargs` parameter), as the dynamic-shapes JSON names it; null when it "
        "binds to none, or to `*args`.",
    )
    type: str = Field(description='"Tensor", or the Python type name of a non-tensor input.')
    shape: list[int] | None = Field(default=None, description="Sizes of a tensor input.")
    dtype: str | None = Field(default=None, description='dtype of a tensor input ("float32").')
    value: Any = Field(
        default=None,
        description="A non-tensor input's value (numbers, strings, booleans; other types as "
        "a short repr); null for tensors.",
    )


class AdapterReport(StrictModel):
    """A PEFT adapter merged into a checkpoint's model before export."""

    path: str = Field(
        description='The adapter\'s folder in the zip, relative to `config.json`, e.g. "adapter".'
    )
    selected_by: Literal["options", "only_folder"] = Field(
        description="`options`: named by the `adapter` option; `only_folder`: the one "
        "sub-folder with an `adapter_config.json`."
    )
    peft_type: str = Field(description='`adapter_config.json`\'s `peft_type`, e.g. "LORA".')
    task_type: str | None = Field(
        default=None, description='`adapter_config.json`\'s `task_type`, e.g. "CAUSAL_LM".'
    )
    r: int | None = Field(default=None, description="The rank, for LoRA-like adapters.")
    alpha: float | None = Field(
        default=None, description="`lora_alpha` (or `alpha`), for LoRA-like adapters."
    )
    target_modules: list[str] | str | None = Field(
        default=None,
        description="The modules the adapter targets, as `adapter_config.json` names them "
        "(a list, or a regular expression or `all-linear`).",
    )
    modules_to_save: list[str] = Field(
        default_factory=list,
        description="Modules the adapter replaces whole (a fine-tuned head), from its weights.",
    )
    adapted_modules: int = Field(
        default=0, description="How many of the model's modules the adapter changed."
    )
    base_model_name_or_path: str | None = Field(
        default=None,
        description="The base the adapter was trained on, as `adapter_config.json` names it "
        "(informative: the base is the checkpoint in the zip).",
    )
    merged: bool = Field(
        default=True,
        description="The adapter's weights were merged into the model's (`merge_and_unload`): "
        "the program holds the merged weights and no adapter modules.",
    )


class CheckpointReport(StrictModel):
    """How a checkpoint upload (a `save_pretrained` directory) became a model."""

    task: str = Field(description='The task exported, e.g. "fill-mask".')
    task_source: Literal["options", "architectures", "auto_map", "adapter"] = Field(
        description="`options`: the `task` option; `architectures`: inferred from "
        "`config.architectures`; `auto_map`: from the checkpoint's own code (`auto_map`); "
        "`adapter`: from the PEFT adapter's `task_type`."
    )
    model_type: str = Field(description='`config.model_type`, e.g. "bert".')
    architecture: str | None = Field(
        default=None, description="The first of `config.architectures`, if any."
    )
    model_class: str = Field(description="The class built for the task, e.g. `BertForMaskedLM`.")
    weights_format: Literal["safetensors", "pytorch_bin"]
    weights_files: list[str] = Field(default_factory=list)
    remote_code: bool = Field(
        default=False,
        description="The model class came from the checkpoint's own code (`auto_map`).",
    )
    newly_initialized: list[str] = Field(
        default_factory=list,
        description="Parameters the checkpoint does not hold, initialized at random (a head "
        "of another task than the checkpoint's); at most 50.",
    )
    generated_inputs: bool = Field(
        default=True,
        description="The example inputs and dynamic shapes were made for the task (false "
        "when an inputs file was uploaded).",
    )
    adapter: AdapterReport | None = Field(
        default=None,
        description="The PEFT adapter merged into the model before export, if the zip held one.",
    )
    tokenizer_files: list[str] = Field(
        default_factory=list,
        max_length=16,
        description="The checkpoint's tokenizer files (`tokenizer.json`, "
        "`tokenizer_config.json`, `special_tokens_map.json`, `added_tokens.json`, "
        "`tokenizer.model`, `vocab.json`, `vocab.txt`, `merges.txt`, `chat_template.jinja` "
        "at its base level, each at most 64 MiB), written beside the artifacts as they were "
        "uploaded, for the runtimes' generation loops.",
    )


WEIGHTS_MAX_LISTED = 200
"""Names listed in `WeightsReport.missing` and `.unexpected`; the counts have them all."""


class WeightsReport(StrictModel):
    """How the uploaded `weights` file was loaded into the model (options `weights`)."""

    file: str = Field(description="The weights file's name as uploaded.")
    format: Literal["safetensors", "pt"] = Field(
        description="`pt`: a `torch.save` file (`.pt`, `.pth`), read with `weights_only=True`."
    )
    key: str | None = Field(
        default=None,
        description="The key of the file's top-level dict the state dict was read from (a "
        'training checkpoint\'s "model_state", "state_dict", …, or option `weights.key`); '
        "null: the file is the state dict.",
    )
    strict: bool = Field(description="Option `weights.strict`.")
    tensors: int = Field(description="Tensors in the state dict read.")
    loaded: int = Field(description="Of those, the tensors loaded into the model.")
    missing: list[str] = Field(
        default_factory=list,
        description="The model's parameters and buffers the file lacks, left as the model "
        f"initialized them (only with `strict: false`); at most {WEIGHTS_MAX_LISTED}.",
    )
    missing_count: int = 0
    unexpected: list[str] = Field(
        default_factory=list,
        description="The file's tensors the model has no place for, not loaded (only with "
        f"`strict: false`); at most {WEIGHTS_MAX_LISTED}.",
    )
    unexpected_count: int = 0


class ModelSummary(StrictModel):
    """What the program holds."""

    parameters: dict[str, int] = Field(default_factory=dict, description="Element counts by dtype.")
    buffers: dict[str, int] = Field(default_factory=dict)
    parameter_count: int = 0
    buffer_count: int = 0
    inputs: list[dict[str, Any]] = Field(default_factory=list)
    outputs: list[dict[str, Any]] = Field(default_factory=list)
