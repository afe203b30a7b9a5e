"""Checkpoint uploads: a zip of a `save_pretrained` directory, no model code (issue 20).

Tiny configs saved here (no downloads); the task is inferred from the architecture or
named, the model built for it, the inputs and named dims made by the engine."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, ExportResult, run_export
from schemas import ExportOptions

transformers = pytest.importorskip("transformers")

FAST = {"verify": {"enabled": False}, "decomposition": {"mode": "none"}}
"""Loading and tracing are what these tests are about."""


def zip_directory(directory: Path, archive: Path, *, folder: str | None = "ckpt") -> Path:
    """The files of `directory` and its sub-folders, under `folder` (or at the root)."""
    with zipfile.ZipFile(archive, "w") as zf:
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            name = path.relative_to(directory).as_posix()
            zf.write(path, f"{folder}/{name}" if folder else name)
    return archive


TINY = {
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}


def saved(directory: Path, model_class: str, config_class: str, **save: Any) -> Path:
    """A tiny model of `model_class`, saved as `save_pretrained` writes it."""
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**TINY, **CONFIGS[config_class])
    getattr(transformers, model_class)(config).save_pretrained(directory, **save)
    return directory


CONFIGS: dict[str, dict[str, Any]] = {
    "BertConfig": {"vocab_size": 64, "max_position_embeddings": 64},
    "LlamaConfig": {"vocab_size": 64, "num_key_value_heads": 1, "max_position_embeddings": 64},
    "ViTConfig": {"image_size": 32, "patch_size": 16, "num_labels": 3},
}


def bert(tmp_path: Path, **save: Any) -> Path:
    return saved(tmp_path / "bert", "BertForMaskedLM", "BertConfig", **save)


def llama(tmp_path: Path) -> Path:
    return saved(tmp_path / "llama", "LlamaForCausalLM", "LlamaConfig")


def vit(tmp_path: Path) -> Path:
    return saved(tmp_path / "vit", "ViTForImageClassification", "ViTConfig")


def export(tmp_path: Path, model: Path, options: dict[str, Any] | None = None) -> ExportResult:
    request = ExportRequest(
        upload=Upload(model=model),
        options=ExportOptions.model_validate(options if options is not None else FAST),
        out_dir=tmp_path / "out",
        work_dir=tmp_path / "work",
    )
    return run_export(request)


def dims(result: ExportResult) -> dict[str, Any]:
    applied = result.report.tracing.dynamic_shapes.applied
    assert isinstance(applied, dict)
    return json.loads(json.dumps(applied, default=lambda m: m.model_dump(exclude_none=True)))


def test_bert_without_a_task_exports_as_fill_mask_with_named_dims(tmp_path: Path) -> None:
    archive = zip_directory(bert(tmp_path), tmp_path / "bert.zip")
    options = {
        "decomposition": {"mode": "none"},
        "verify": {"samples": 1, "roundtrip": False},
    }
    result = export(tmp_path, archive, options)
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None
    assert report.checkpoint.task == "fill-mask"
    assert report.checkpoint.task_source == "architectures"
    assert report.checkpoint.model_class == "BertForMaskedLM"
    assert report.checkpoint.weights_format == "safetensors"
    assert report.checkpoint.weights_files == ["model.safetensors"]
    assert report.checkpoint.newly_initialized == []
    assert report.tracing.dynamic_shapes.source == "checkpoint"
    applied = dims(result)
    assert set(applied) == {"input_ids", "attention_mask", "token_type_ids"}
    assert applied["input_ids"] == {
        "0": {"name": "batch_size", "min": 1, "max": 64},
        "1": {"name": "sequence_length", "min": 1, "max": 64},
    }
    assert applied["attention_mask"] == {"0": "batch_size", "1": "sequence_length"}
    assert [(i.name, i.shape, i.dtype) for i in report.inputs] == [
        ("input_ids", [2, 16], "int64"),
        ("attention_mask", [2, 16], "int64"),
        ("token_type_ids", [2, 16], "int64"),
    ]
    assert report.verification is not None and report.verification.passed is True
    assert report.environment.libraries["transformers"] == transformers.__version__
    assert (tmp_path / "out" / "program.pt2").is_file()


def test_llama_without_a_cache_exports_the_plain_forward(tmp_path: Path) -> None:
    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip", folder=None)
    options = {**FAST, "task": "text-generation", "generation": {"cache": False}}
    result = export(tmp_path, archive, options)
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None
    assert (report.checkpoint.task, report.checkpoint.task_source) == (
        "text-generation",
        "options",
    )
    assert report.checkpoint.model_class == "LlamaForCausalLM"
    assert set(dims(result)) == {"input_ids", "attention_mask"}  # no token_type_ids
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    outputs = [o for o in signature["outputs"] if o["kind"] == "user_output"]
    assert len(outputs) == 1 and outputs[0]["shape"][2] == 64  # logits only, no cache


def test_vit_image_classification_has_a_static_image_size(tmp_path: Path) -> None:
    archive = zip_directory(vit(tmp_path), tmp_path / "vit.zip")
    result = export(tmp_path, archive)
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None and report.checkpoint.task == "image-classification"
    assert dims(result) == {"pixel_values": {"0": {"name": "batch_size", "min": 1, "max": 64}}}
    assert [(i.name, i.shape) for i in report.inputs] == [("pixel_values", [2, 3, 32, 32])]


def test_sharded_safetensors_load(tmp_path: Path) -> None:
    directory = bert(tmp_path, max_shard_size="4KB")
    assert (directory / "model.safetensors.index.json").is_file()
    result = export(tmp_path, zip_directory(directory, tmp_path / "sharded.zip"))
    assert result.succeeded, result.report.error
    assert result.report.checkpoint is not None
    assert len(result.report.checkpoint.weights_files) > 1
    assert result.report.checkpoint.newly_initialized == []


def test_a_bin_only_checkpoint_loads_in_the_engine(tmp_path: Path) -> None:
    directory = bert(tmp_path)
    state = transformers.BertForMaskedLM.from_pretrained(directory).state_dict()
    (directory / "model.safetensors").unlink()
    torch.save(state, directory / "pytorch_model.bin")
    result = export(tmp_path, zip_directory(directory, tmp_path / "bin.zip"))
    assert result.succeeded, result.report.error
    assert result.report.checkpoint is not None
    assert result.report.checkpoint.weights_format == "pytorch_bin"
    assert result.report.checkpoint.weights_files == ["pytorch_model.bin"]
    assert result.report.checkpoint.newly_initialized == []


def test_a_head_of_another_task_is_reported_as_newly_initialized(tmp_path: Path) -> None:
    archive = zip_directory(bert(tmp_path), tmp_path / "bert.zip")
    result = export(tmp_path, archive, {**FAST, "task": "text-classification", "targets": ["onnx"]})
    assert result.succeeded, result.report.error
    assert result.report.checkpoint is not None
    assert result.report.checkpoint.model_class == "BertForSequenceClassification"
    assert "classifier.weight" in result.report.checkpoint.newly_initialized
    # the ONNX model names the task the loader chose
    onnx = result.report.targets["onnx"]
    assert onnx.status == "succeeded", onnx.error
    assert onnx.details["metadata"]["torchport.task"] == "text-classification"


# --- errors -----------------------------------------------------------------------------


def failure(result: ExportResult) -> tuple[str, str | None, dict[str, Any]]:
    assert not result.succeeded and result.report.error is not None
    error = result.report.error
    return error.code, error.stage, error.details


def test_a_zip_without_config_or_source_is_refused(tmp_path: Path) -> None:
    directory = bert(tmp_path)
    (directory / "config.json").unlink()
    code, stage, details = failure(export(tmp_path, zip_directory(directory, tmp_path / "x.zip")))
    assert (code, stage, details["reason"]) == ("invalid_request", "loading", "no_model")


def test_a_task_the_architecture_cannot_do_lists_the_ones_it_can(tmp_path: Path) -> None:
    archive = zip_directory(vit(tmp_path), tmp_path / "vit.zip")
    code, stage, details = failure(export(tmp_path, archive, {**FAST, "task": "fill-mask"}))
    assert (code, stage, details["reason"]) == ("invalid_request", "loading", "task_not_supported")
    assert details["task"] == "fill-mask" and details["model_type"] == "vit"
    assert "image-classification" in details["supported_tasks"]
    assert "fill-mask" not in details["supported_tasks"]


def test_an_unknown_architecture_asks_for_the_task(tmp_path: Path) -> None:
    directory = bert(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["architectures"] = ["BertForSomethingElse"]
    (directory / "config.json").write_text(json.dumps(config))
    code, stage, details = failure(export(tmp_path, zip_directory(directory, tmp_path / "x.zip")))
    assert (code, stage, details["reason"]) == (
        "model_not_found",
        "loading",
        "unknown_architecture",
    )
    assert details["architectures"] == ["BertForSomethingElse"]
    assert "fill-mask" in details["supported_tasks"]


def test_an_unknown_model_type_is_model_not_found(tmp_path: Path) -> None:
    directory = bert(tmp_path)
    (directory / "config.json").write_text(json.dumps({"model_type": "no-such-model"}))
    code, stage, details = failure(export(tmp_path, zip_directory(directory, tmp_path / "x.zip")))
    assert (code, stage, details["reason"]) == ("model_not_found", "loading", "unknown_model_type")
    assert details["model_type"] == "no-such-model"


def test_a_checkpoint_without_weights_is_invalid_inputs(tmp_path: Path) -> None:
    directory = bert(tmp_path)
    (directory / "model.safetensors").unlink()
    code, stage, details = failure(export(tmp_path, zip_directory(directory, tmp_path / "x.zip")))
    assert (code, stage, details["reason"]) == ("invalid_inputs", "loading", "no_weights")


def test_an_unknown_task_is_refused_by_the_options() -> None:
    with pytest.raises(ValueError):
        ExportOptions.model_validate({"task": "text-to-everything"})


@pytest.mark.parametrize(
    ("model_type", "architecture", "task"),
    [
        ("mvp", "MvpForConditionalGeneration", "text2text-generation"),  # in the MLM list too
        ("bart", "BartForConditionalGeneration", "text2text-generation"),
        ("voxtral", "VoxtralForConditionalGeneration", "automatic-speech-recognition"),
        ("xlm", "XLMWithLMHeadModel", "text-generation"),  # no head in its name: the first
        ("bert", "BertForMaskedLM", "fill-mask"),
        ("llama", "LlamaForCausalLM", "text-generation"),
        ("bert", "BertModel", "feature-extraction"),
    ],
)
def test_the_task_inferred_is_the_one_the_class_name_says(
    model_type: str, architecture: str, task: str
) -> None:
    from engine.load.checkpoint.tasks import choose_task

    choice = choose_task(None, model_type, [architecture], {})
    assert choice is not None and (choice.task, choice.source) == (task, "architectures")


def test_the_checkpoints_tokenizer_files_are_written_beside_the_artifacts(
    tmp_path: Path,
) -> None:
    directory = bert(tmp_path)
    files = {
        "tokenizer.json": b'{"version": "1.0", "model": {"type": "WordPiece"}}',
        "tokenizer_config.json": b'{"model_max_length": 512}',
        "vocab.txt": b"[PAD]\n[UNK]\nhello\n",
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    (directory / "notes.txt").write_bytes(b"not a tokenizer file")
    (directory / "special_tokens_map.json").mkdir()  # no regular file: not taken
    archive = zip_directory(directory, tmp_path / "bert.zip")
    options = {"decomposition": {"mode": "none"}, "verify": {"samples": 1, "roundtrip": False}}
    result = export(tmp_path, archive, options)
    assert result.succeeded, result.report.error
    assert result.report.checkpoint is not None
    assert result.report.checkpoint.tokenizer_files == [
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    ]
    out = tmp_path / "out"
    for name, data in files.items():
        assert (out / name).read_bytes() == data
    assert not (out / "notes.txt").exists()
    listed = {a.name: a for a in result.report.artifacts}
    assert set(files) <= set(listed)
    assert listed["vocab.txt"].size == len(files["vocab.txt"])


def test_a_tokenizer_file_that_is_a_link_or_too_big_is_not_taken(tmp_path: Path) -> None:
    from engine.load.checkpoint import tokenizer
    from schemas.model_zip import TOKENIZER_MAX_BYTES

    (tmp_path / "secret").write_bytes(b"another file")
    (tmp_path / "tokenizer.json").symlink_to(tmp_path / "secret")
    with open(tmp_path / "tokenizer.model", "wb") as handle:
        handle.truncate(TOKENIZER_MAX_BYTES + 1)
    (tmp_path / "merges.txt").write_bytes(b"#version: 0.2\n")
    assert tokenizer.found(tmp_path) == ["merges.txt"]
