"""transformers mixture-of-experts models are switched to an experts implementation that
traces to ATen only; everything else is left as it is."""

from __future__ import annotations

import copy

import pytest
import torch

from engine.trace.library_adaptations import adapt_for_export
from tests.engine.model_files import import_model_file

pytest.importorskip("transformers")


def _fresh(name: str) -> torch.nn.Module:
    model: torch.nn.Module = copy.deepcopy(import_model_file(name).model)
    return model


@pytest.mark.parametrize(
    ("name", "type_name"),
    [
        ("hf_mixtral", "MixtralForCausalLM"),
        ("hf_qwen3_moe", "Qwen3MoeForCausalLM"),
        ("hf_deepseek_v3", "DeepseekV3ForCausalLM"),
    ],
)
def test_moe_models_switch_to_batched_mm(name: str, type_name: str) -> None:
    model = _fresh(name)
    (warning,) = adapt_for_export(model)
    assert warning.code == "library_adapted"
    assert warning.details == {
        "library": "transformers",
        "module": "",
        "type": type_name,
        "setting": "experts_implementation",
        "before": {"": "grouped_mm"},
        "after": {"": "batched_mm"},
    }
    assert model.config._experts_implementation == "batched_mm"  # type: ignore[union-attr]
    assert adapt_for_export(model) == []  # already exportable


def test_the_copy_taken_before_keeps_the_users_setting() -> None:
    model = _fresh("hf_mixtral")
    pristine = copy.deepcopy(model)
    adapt_for_export(model)
    assert pristine.config._experts_implementation == "grouped_mm"  # type: ignore[union-attr]


def test_eager_experts_are_switched_too() -> None:
    model = _fresh("hf_qwen3_moe")
    model.set_experts_implementation("eager")  # type: ignore[operator]
    (warning,) = adapt_for_export(model)
    assert (warning.details["before"], warning.details["after"]) == (
        {"": "eager"},
        {"": "batched_mm"},
    )


def test_models_without_experts_are_left_alone() -> None:
    model = _fresh("hf_llama")
    before = model.config._experts_implementation  # type: ignore[union-attr]
    assert adapt_for_export(model) == []
    assert model.config._experts_implementation == before  # type: ignore[union-attr]


def test_a_plain_module_is_left_alone() -> None:
    assert adapt_for_export(torch.nn.Linear(2, 2)) == []


def test_the_switched_model_traces_to_aten_with_the_same_numbers() -> None:
    upload = import_model_file("hf_mixtral")
    model = _fresh("hf_mixtral")
    with torch.no_grad():
        expected = model(**upload.example_kwargs).logits
    adapt_for_export(model)
    ep = torch.export.export(model, (), dict(upload.example_kwargs), strict=False)
    namespaces = {
        node.target.namespace
        for node in ep.graph.nodes
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload)
    }
    assert namespaces == {"aten"}
    with torch.no_grad():
        got = ep.module()(**upload.example_kwargs).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1.3e-6)
