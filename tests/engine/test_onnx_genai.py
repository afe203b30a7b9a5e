"""A generation-ready LLM's `model.onnx` runs as delivered in ONNX Runtime GenAI
(`engine.targets.onnx.genai`): `genai_config.json` beside it, and the generation check run
again by its `Generator` (`report.targets.onnx.runtime_generation`), for the tests' tiny
Llama and Qwen3 checkpoints; a model whose tokens differ there fails the target."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import onnx
import pytest

from tests.engine.test_checkpoints import export, zip_directory
from tests.engine.test_generation import TEXT_GENERATION, llama, qwen3, runtime_mismatch

og = pytest.importorskip("onnxruntime_genai")
pytestmark = pytest.mark.slow  # ONNX conversions of generation-ready LLMs

ONNX = {**TEXT_GENERATION, "targets": ["onnx"], "profile": {"enabled": False}}


def _export(tmp_path: Path, kind: str) -> Any:
    directory = (llama if kind == "llama" else qwen3)(tmp_path)
    return export(tmp_path, zip_directory(directory, tmp_path / "model.zip"), ONNX)


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_folder_generates_eagers_tokens_in_onnx_runtime_genai(
    tmp_path: Path, kind: str
) -> None:
    result = _export(tmp_path, kind)
    report = result.report
    target = report.targets["onnx"]
    assert target.status == "succeeded", target.error
    # the weights beside the graph under `auto`, as the builder writes an LLM
    assert target.artifacts == ["model.onnx", "genai_config.json", "model.onnx.data"]
    assert target.details["external_data"] is True
    config = json.loads(result.artifacts["genai_config.json"].read_text())
    decoder = config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx" and config["model"]["type"] == "decoder"
    assert decoder["num_hidden_layers"] == 2 and decoder["num_key_value_heads"] == 2
    assert decoder["inputs"]["position_ids"] == "position_ids"
    assert config["search"]["past_present_share_buffer"] is True  # written in place
    # One GroupQueryAttention node per layer, as ONNX Runtime GenAI's builder writes it.
    assert target.details["attention"] == "com.microsoft::GroupQueryAttention"
    nodes = [node.op_type for node in onnx.load(result.artifacts["model.onnx"]).graph.node]
    assert nodes.count("GroupQueryAttention") == 2 and "Softmax" not in nodes
    in_runtime = target.runtime_generation
    assert in_runtime is not None and in_runtime.passed is True and in_runtime.matched
    check = target.generation
    assert check is not None
    assert in_runtime.expected == check.expected and in_runtime.generated == check.expected
    assert len(in_runtime.runs) == 2 and all(run.matched for run in in_runtime.runs)

    # The folder alone, as a user runs it (docs/huggingface.md): eager's first tokens.
    folder = result.artifacts["model.onnx"].parent
    model = og.Model(str(folder))
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(check.prompt_ids) + 4, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens([check.prompt_ids])
    while not generator.is_done():
        generator.generate_next_token()
    tokens = [int(t) for t in generator.get_sequence(0)[len(check.prompt_ids) :]]
    assert tokens == check.expected[: len(tokens)] and len(tokens) >= 1


def test_tokens_that_differ_in_the_runtime_fail_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runtime's loop is checked, not assumed: a runtime that generated other tokens
    (here its generation shifted by one in the vocabulary) fails the float target."""
    from engine.targets.onnx import genai

    real = genai.generate

    def shifted(model: Any, prompt: list[int], max_new_tokens: int) -> list[int]:
        return [(token + 1) % 96 for token in real(model, prompt, max_new_tokens)]

    monkeypatch.setattr(genai, "generate", shifted)
    report = _export(tmp_path, "llama").report
    runtime_mismatch(report.targets["onnx"])
