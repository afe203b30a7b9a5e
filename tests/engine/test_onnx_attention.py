"""A generation-ready LLM's ONNX form (`engine.targets.onnx.attention`): ONNX Runtime's
`GroupQueryAttention` in place of attention spelled out in standard ops; the generic
form's logits and presents in torch and in ONNX Runtime, the eager model left as it was,
and the generic form kept, with the reason, for models the node does not fit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils._pytree as pytree

from engine.generation import onnx_past
from engine.generation.ready import Generation
from engine.targets import onnx as onnx_target
from engine.targets.onnx import attention
from tests.engine.test_checkpoints import export, zip_directory
from tests.engine.test_generation import TEXT_GENERATION, config_of, llama

transformers = pytest.importorskip("transformers")
onnxruntime = pytest.importorskip("onnxruntime")


def model_of(kind: str = "llama", **changes: Any) -> Any:
    torch.manual_seed(0)
    config = config_of(kind)
    for name, value in changes.items():
        setattr(config, name, value)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def generation_of(model: Any) -> Generation:
    return Generation(model=model, prompt=torch.zeros(1, 4, dtype=torch.long), max_new_tokens=4,
                      max_cache_len=64)  # fmt: skip


def flat(outputs: Any) -> list[torch.Tensor]:
    return [leaf.detach() for leaf in pytree.tree_leaves(outputs)]


def inputs(batch: int, past: int, new: int, layers: int = 2) -> dict[str, Any]:
    """Seeded inputs of the tiny models' past/present form: `new` tokens after `past`."""
    generator = torch.Generator().manual_seed(batch * 100 + past * 10 + new)
    return {
        "input_ids": torch.randint(0, 96, (batch, new), generator=generator),
        "attention_mask": torch.ones(batch, past + new, dtype=torch.long),
        "position_ids": torch.arange(past, past + new).repeat(batch, 1),
        "past_key_values": [
            tuple(torch.randn(batch, 2, past, 8, generator=generator) for _ in range(2))
            for _ in range(layers)
        ],
    }


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_form_computes_the_generic_forms_logits_and_presents(kind: str) -> None:
    model = model_of(kind)
    assert attention.unsuited(model) is None
    generation = generation_of(model)
    generic = onnx_past.past_program(generation).program.module()
    grouped = onnx_past.past_program(generation, attention.form)
    assert attention.lowered_attention(grouped.program) == grouped.layers == 2
    # the eager model keeps its own attention; the form shares its weights
    assert model.config._attn_implementation == "sdpa"
    assert all(not isinstance(layer, type) for layer in model.modules())
    for batch, past, new in [(1, 0, 5), (2, 0, 6), (1, 6, 1), (3, 9, 1), (1, 7, 4)]:
        given = inputs(batch, past, new)
        want, got = flat(generic(**given)), flat(grouped.program.module()(**given))
        assert [t.shape for t in got] == [t.shape for t in want]
        for expected, found in zip(want, got, strict=True):
            torch.testing.assert_close(found, expected, atol=1e-5, rtol=1e-5)


def converted(grouped: Any, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """`grouped` (the form's past/present program) as `model.onnx`, and its facts."""
    path = tmp_path / "model.onnx"
    facts: dict[str, Any] = {}
    onnx_target.convert(
        grouped.program, (), grouped.kwargs, path, facts=facts,
        input_names=grouped.input_names, output_names=grouped.output_names,
        dim_names=grouped.dim_names, attention=attention.NODE,
    )  # fmt: skip
    return path, facts


def test_onnx_runtime_runs_one_group_query_attention_node_per_layer(tmp_path: Path) -> None:
    import onnx

    grouped = onnx_past.past_program(generation_of(model_of("qwen3")), attention.form)
    path, facts = converted(grouped, tmp_path)
    assert facts["attention"] == attention.NODE and "attention_reason" not in facts
    nodes = onnx.load(path).graph.node
    found = [node for node in nodes if node.op_type == "GroupQueryAttention"]
    assert len(found) == 2 and {node.domain for node in found} == {"com.microsoft"}
    assert not {"Softmax", "Expand"} & {node.op_type for node in nodes}
    run = onnx_target.load(path, grouped.program, input_names=facts["inputs"])
    # the verified example is one row (ONNX Runtime takes new tokens after a past in
    # batches of one); a batched prefill and batched single-token steps run too
    assert grouped.kwargs["input_ids"].shape == (1, 4)
    for given in [grouped.kwargs, inputs(2, 0, 5), inputs(3, 6, 1)]:
        want = flat(grouped.program.module()(**given))
        got = run((), given)
        for expected, found_ in zip(want, got, strict=True):
            torch.testing.assert_close(found_, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"sliding_window": 16, "use_sliding_window": True}, "slides over 16"),
        ({"layer_types": ["full_attention", "sliding_attention"], "sliding_window": 16},
         "attend otherwise"),
        ({"attn_logit_softcapping": 30.0}, "soft-capped"),
    ],
)  # fmt: skip
def test_attention_the_node_does_not_compute_keeps_the_generic_form(
    changes: dict[str, Any], reason: str
) -> None:
    assert reason in (attention.unsuited(model_of("qwen3", **changes)) or "")


def test_a_bfloat16_model_takes_the_node_in_float32(tmp_path: Path) -> None:
    """A bfloat16 model's ONNX form is widened to float32 (ONNX Runtime's CPU provider
    has no bfloat16 Mul, nor a bfloat16 GroupQueryAttention): the node still serves it."""
    import onnx

    model = model_of().to(torch.bfloat16)
    assert attention.unsuited(model) is None
    grouped = onnx_past.past_program(generation_of(model), attention.form)
    path, facts = converted(grouped, tmp_path)
    assert (facts["widened_from"], facts["dtype"]) == ("bfloat16", "float32")
    written = onnx.load(path)
    types = {value.type.tensor_type.elem_type for value in written.graph.input}
    types |= {tensor.data_type for tensor in written.graph.initializer}
    assert onnx.TensorProto.BFLOAT16 not in types and onnx.TensorProto.FLOAT in types
    assert sum(node.op_type == "GroupQueryAttention" for node in written.graph.node) == 2
    run = onnx_target.load(path, grouped.program, input_names=facts["inputs"])
    want = flat(grouped.program.module()(**grouped.kwargs))
    for expected, found in zip(want, run((), grouped.kwargs), strict=True):
        assert found.dtype == torch.float32
        torch.testing.assert_close(found, expected.float(), atol=0.05, rtol=0.05)


@pytest.mark.slow
def test_the_generic_form_stays_an_option_and_a_fallback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`onnx.custom_ops: false` writes attention in standard ops, and a form whose
    attention did not all go through the node falls back to them: both still verified and
    generating eager's tokens, the report saying why."""
    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip", folder=None)
    options = {**TEXT_GENERATION, "targets": ["onnx"], "profile": {"enabled": False}}
    off = export(tmp_path / "off", archive, {**options, "onnx": {"custom_ops": False}})
    target = off.report.targets["onnx"]
    assert target.status == "succeeded", target.error
    assert target.details["attention"] == "standard"
    assert target.details["attention_reason"] == "onnx.custom_ops is false"
    assert target.generation is not None and target.generation.passed
    config = json.loads(off.artifacts["genai_config.json"].read_text())
    assert config["search"]["past_present_share_buffer"] is False  # the cache grows
    if target.runtime_generation is not None:  # onnxruntime-genai is installed
        assert target.runtime_generation.passed

    monkeypatch.setattr(attention, "lowered_attention", lambda program: 1)
    partial = export(tmp_path / "partial", archive, options)
    target = partial.report.targets["onnx"]
    assert target.status == "succeeded", target.error
    assert target.details["attention"] == "standard"
    assert target.details["attention_reason"] == "1 of 2 layers' attention went through the op"
    assert target.generation is not None and target.generation.passed


@pytest.mark.slow
def test_a_float16_llm_attends_through_the_node_and_generates(tmp_path: Path) -> None:
    """`onnx.dtype: float16`: the node takes float16 (as the builder's fp16 models do),
    and the model still generates eager's tokens in both runtimes."""
    import onnx

    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip", folder=None)
    options = {**TEXT_GENERATION, "targets": ["onnx"], "profile": {"enabled": False}}
    half = export(tmp_path / "half", archive, {**options, "onnx": {"dtype": "float16"}})
    target = half.report.targets["onnx"]
    assert target.status == "succeeded", target.error
    assert (target.details["attention"], target.details["dtype"]) == (attention.NODE, "float16")
    nodes = onnx.load(half.artifacts["model.onnx"]).graph.node
    assert sum(node.op_type == "GroupQueryAttention" for node in nodes) == 2
    assert target.generation is not None and target.generation.passed
    if target.runtime_generation is not None:  # onnxruntime-genai is installed
        assert target.runtime_generation.passed


def test_a_program_the_exporter_refuses_undecomposed_converts_decomposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The past/present program goes to the exporter undecomposed; where the exporter
    fails on it, its core ATen decomposition is converted, the failure noted."""
    import onnx

    from engine.targets import TargetError

    grouped = onnx_past.past_program(generation_of(model_of()), attention.form)
    real, given = torch.onnx.export, []

    def refusing_the_first(program: Any, *args: Any, **kwargs: Any) -> Any:
        given.append(program)
        if len(given) % 2:
            raise RuntimeError("no translation for this op")
        return real(program, *args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", refusing_the_first)
    path, facts = tmp_path / "model.onnx", {}
    names = {"input_names": grouped.input_names, "output_names": grouped.output_names}
    with pytest.raises(TargetError, match="no translation for this op"):
        onnx_target.convert(grouped.program, (), grouped.kwargs, path, **names)
    given.clear()
    onnx_target.convert(
        grouped.program, (), grouped.kwargs, path, facts=facts, decompose_on_failure=True,
        **names,
    )  # fmt: skip
    assert given[0] is grouped.program and given[1] is not grouped.program
    assert "no translation for this op" in facts["native_ops_failed"]
    nodes = [node.op_type for node in onnx.load(path).graph.node]
    assert nodes.count("GroupQueryAttention") == 2
    assert any("decomposed program" in note for note in onnx_target.notes(facts))
