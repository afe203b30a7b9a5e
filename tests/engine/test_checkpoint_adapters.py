"""PEFT adapters beside a checkpoint: merged before export (issue 20).

A tiny Llama (and BERT) saved here with a LoRA adapter made by peft, its B matrices
random so that merging changes the outputs; the broken adapters are that one, altered."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.engine.test_checkpoints import CONFIGS, FAST, TINY, export, failure, zip_directory

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

LORA = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"]}


def _llama() -> Any:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY, **CONFIGS["LlamaConfig"]))


def _with_lora(model: Any, **config: Any) -> Any:
    """`model` with a LoRA adapter whose A and B are random (peft's default B is zero)."""
    torch.manual_seed(1)
    settings = {**LORA, "task_type": "CAUSAL_LM", "init_lora_weights": False, **config}
    return peft.get_peft_model(model, peft.LoraConfig(**settings))


@pytest.fixture(scope="module")
def llama_with_adapter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Llama checkpoint with its LoRA adapter in the sub-folder `adapter`."""
    directory = tmp_path_factory.mktemp("llama") / "llama"
    _llama().save_pretrained(directory)
    _with_lora(_llama()).save_pretrained(directory / "adapter")
    return directory


@pytest.fixture
def checkpoint(llama_with_adapter: Path, tmp_path: Path) -> Path:
    """A copy of the Llama checkpoint with its adapter, for a test to change."""
    return Path(shutil.copytree(llama_with_adapter, tmp_path / "llama"))


def _merged(directory: Path, adapter: str) -> Any:
    base = transformers.AutoModelForCausalLM.from_pretrained(directory, local_files_only=True)
    return peft.PeftModel.from_pretrained(base, str(directory / adapter)).merge_and_unload()


def test_a_lora_adapter_is_merged_before_export(checkpoint: Path, tmp_path: Path) -> None:
    options = {
        "decomposition": {"mode": "none"},
        "verify": {"samples": 1, "roundtrip": False},
        "generation": {"cache": False},
    }
    result = export(tmp_path, zip_directory(checkpoint, tmp_path / "llama.zip"), options)
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None and report.checkpoint.adapter is not None
    assert (report.checkpoint.task, report.checkpoint.task_source) == ("text-generation", "adapter")
    assert report.checkpoint.model_class == "LlamaForCausalLM"
    adapter = report.checkpoint.adapter.model_dump()
    assert adapter == {
        "path": "adapter",
        "selected_by": "only_folder",
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": 4,
        "alpha": 8.0,
        "target_modules": ["q_proj", "v_proj"],
        "modules_to_save": [],
        "adapted_modules": 2,
        "base_model_name_or_path": None,
        "merged": True,
    }
    assert report.environment.libraries["peft"] == peft.__version__
    assert report.verification is not None and report.verification.verdict == "verified"

    program = torch.export.load(tmp_path / "out" / "program.pt2")
    assert not [name for name in program.state_dict if "lora" in name]
    torch.manual_seed(2)
    inputs = {
        "input_ids": torch.randint(0, 64, (2, 12)),
        "attention_mask": torch.ones(2, 12, dtype=torch.long),
    }
    got = program.module()(**inputs)["logits"]
    with torch.no_grad():
        merged = _merged(checkpoint, "adapter")(**inputs).logits
        base = transformers.AutoModelForCausalLM.from_pretrained(checkpoint)(**inputs).logits
    torch.testing.assert_close(got, merged, atol=1e-5, rtol=1e-5)
    assert (got - base).abs().max() > 1e-2  # the adapter changed the model


def test_a_classification_adapter_brings_its_task_and_head(tmp_path: Path) -> None:
    config = transformers.BertConfig(**TINY, **CONFIGS["BertConfig"])
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(config)
    directory = tmp_path / "bert"
    model.bert.save_pretrained(directory)  # the base: BertModel, no classifier
    adapted = _with_lora(model, task_type="SEQ_CLS", target_modules=["query", "value"])
    adapted.save_pretrained(directory / "lora")
    result = export(tmp_path, zip_directory(directory, tmp_path / "bert.zip"), FAST)
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None and report.checkpoint.adapter is not None
    assert (report.checkpoint.task, report.checkpoint.task_source) == (
        "text-classification",
        "adapter",
    )
    assert report.checkpoint.model_class == "BertForSequenceClassification"
    assert "classifier" in report.checkpoint.adapter.modules_to_save
    assert report.checkpoint.newly_initialized == []  # the head is the adapter's
    program = torch.export.load(tmp_path / "out" / "program.pt2")
    inputs = {
        "input_ids": torch.randint(0, 64, (2, 8)),
        "attention_mask": torch.ones(2, 8, dtype=torch.long),
        "token_type_ids": torch.zeros(2, 8, dtype=torch.long),
    }
    with torch.no_grad():
        expected = adapted.merge_and_unload().eval()(**inputs).logits
    torch.testing.assert_close(program.module()(**inputs)["logits"], expected)


def test_the_adapter_option_picks_one_of_several(checkpoint: Path, tmp_path: Path) -> None:
    shutil.copytree(checkpoint / "adapter", checkpoint / "other")
    archive = zip_directory(checkpoint, tmp_path / "two.zip")
    code, stage, details = failure(export(tmp_path, archive))
    assert (code, stage, details["reason"]) == ("invalid_request", "loading", "several_adapters")
    assert details["adapters"] == ["adapter", "other"]
    options = {
        **FAST,
        "adapter": "other",
        "task": "text-generation",
        "generation": {"cache": False},
    }
    result = export(tmp_path, archive, options)
    assert result.succeeded, result.report.error
    assert result.report.checkpoint is not None and result.report.checkpoint.adapter is not None
    assert result.report.checkpoint.task_source == "options"
    assert result.report.checkpoint.adapter.path == "other"
    assert result.report.checkpoint.adapter.selected_by == "options"
    code, _, details = failure(export(tmp_path, archive, {**FAST, "adapter": "nope"}))
    assert (code, details["reason"]) == ("invalid_request", "adapter_not_found")
    assert details["available"] == ["adapter", "other"]


def test_an_adapter_without_peft_is_environment_mismatch(
    checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "peft", None)  # `import peft` raises ImportError
    code, stage, details = failure(
        export(tmp_path, zip_directory(checkpoint, tmp_path / "llama.zip"))
    )
    assert (code, stage, details["reason"]) == (
        "environment_mismatch",
        "loading",
        "adapter_needs_peft",
    )
    assert details["missing_module"] == "peft" and details["unmet"] == ["peft"]
    assert details["requirements"][0]["name"] == "peft"
    assert details["requirements"][0]["met"] is False


def _config(directory: Path, **changes: Any) -> None:
    path = directory / "adapter" / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def _drop_lora_b(directory: Path) -> None:
    path = directory / "adapter" / "adapter_model.safetensors"
    save_file({k: v for k, v in load_file(path).items() if "lora_B" not in k}, path)


BROKEN = {
    "not_json": (
        lambda d: (d / "adapter" / "adapter_config.json").write_text("{nope"),
        ("invalid_inputs", "bad_adapter_config"),
    ),
    "unknown_peft_type": (
        lambda d: _config(d, peft_type="NO_SUCH_TUNER"),
        ("invalid_inputs", "bad_adapter_config"),
    ),
    "rank_of_other_weights": (
        lambda d: _config(d, r=8),
        ("weights_mismatch", "adapter_shape_mismatch"),
    ),
    "targets_the_model_lacks": (
        lambda d: _config(d, target_modules=["w_qkv"]),
        ("weights_mismatch", "adapter_target_not_found"),
    ),
    "weights_missing": (_drop_lora_b, ("weights_mismatch", "adapter_keys_missing")),
    "pickled_weights_only": (
        lambda d: (d / "adapter" / "adapter_model.safetensors").rename(
            d / "adapter" / "adapter_model.bin"
        ),
        ("invalid_inputs", "no_adapter_weights"),
    ),
    "corrupt_weights": (
        lambda d: (d / "adapter" / "adapter_model.safetensors").write_bytes(b"\0" * 64),
        ("invalid_inputs", "unreadable_adapter"),
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_adapter_fails_with_a_stable_code(
    case: str, checkpoint: Path, tmp_path: Path
) -> None:
    breaks, expected = BROKEN[case]
    breaks(checkpoint)
    code, stage, details = failure(
        export(tmp_path, zip_directory(checkpoint, tmp_path / "llama.zip"))
    )
    assert (code, details["reason"]) == expected
    assert (stage, details["adapter"]) == ("loading", "adapter")


def test_a_prompt_learning_adapter_is_not_mergeable(checkpoint: Path, tmp_path: Path) -> None:
    shutil.rmtree(checkpoint / "adapter")
    config = peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2)
    peft.get_peft_model(_llama(), config).save_pretrained(checkpoint / "adapter")
    code, stage, details = failure(
        export(tmp_path, zip_directory(checkpoint, tmp_path / "llama.zip"))
    )
    assert (code, stage, details["reason"]) == (
        "invalid_request",
        "loading",
        "adapter_not_mergeable",
    )
    assert details["peft_type"] == "PROMPT_TUNING"


def test_an_adapter_without_its_base_is_refused(checkpoint: Path, tmp_path: Path) -> None:
    _config(checkpoint, base_model_name_or_path="meta-llama/Llama-3.2-1B")
    archive = zip_directory(checkpoint / "adapter", tmp_path / "adapter.zip", folder="my-lora")
    code, stage, details = failure(export(tmp_path, archive))
    assert (code, stage, details["reason"]) == (
        "invalid_request",
        "loading",
        "adapter_without_base",
    )
    assert details["base_model_name_or_path"] == "meta-llama/Llama-3.2-1B"
