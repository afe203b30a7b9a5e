"""The generation check proves the cache (issue 34): every check runs a second prompt and
starts again at position 0 on the same loaded artifact, records each run's prompt ids,
warns when eager's reference is nearly constant; the static-cache program refuses a
position past `max_cache_len`; the ONNX LLM takes `position_ids` and carries no node
metadata.

Tiny Llama (tests/engine/test_generation.py's config), no export pipeline: each test
runs the check's own functions on the eager wrapper or on a converted ONNX model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.generation import mismatch_details, mismatch_error, onnx_check, runner_check
from engine.generation.checks import constant_warnings, nearly_constant
from engine.generation.ready import (
    CACHE_BOUND_MESSAGE,
    PROMPT_TOKENS,
    SECOND_PROMPT_TOKENS,
    Generation,
    make_ready,
)
from schemas import GenerationCheck, GenerationOptions, GenerationRun
from tests.engine.test_generation import config_of

transformers = pytest.importorskip("transformers")

Flat = list[torch.Tensor]


def ready(max_new_tokens: int = 8) -> tuple[torch.nn.Module, Generation]:
    """The tests' tiny Llama behind transformers' static-cache wrapper, and its check."""
    torch.manual_seed(0)
    config = config_of("llama")
    model = transformers.LlamaForCausalLM(config).eval()
    options = GenerationOptions(max_new_tokens=max_new_tokens)
    wrapper, generation, _, _ = make_ready(model, config, options)
    return wrapper, generation


def test_every_prompt_runs_on_one_artifact_and_is_recorded() -> None:
    wrapper, generation = ready()
    starts: list[int] = []

    def runtime(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Flat:
        starts.append(int(kwargs["cache_position"][0]))
        with torch.no_grad():
            return [wrapper(**kwargs)]

    check = runner_check(runtime, generation)
    assert check.matched and check.first_mismatch is None
    assert check.prompt_ids == generation.prompt[0].tolist()
    assert len(check.prompt_ids) == check.prompt_tokens == PROMPT_TOKENS
    assert [run.prompt for run in check.runs] == ["second", "example"]
    second, again = check.runs
    assert len(second.prompt_ids) == SECOND_PROMPT_TOKENS
    assert again.prompt_ids == check.prompt_ids and again.expected == check.expected
    assert second.expected != check.expected
    for run in check.runs:
        assert run.matched and run.generated == run.expected and len(run.generated) == 8
    assert starts.count(0) == 3  # three prefills at position 0 on the one wrapper


def test_a_runtime_that_keeps_the_last_sequence_fails_the_restart() -> None:
    """A runtime that counts positions itself (a restart continues after the sequence
    before, whose keys and values it still holds) matches eager on the first run and
    differs once it starts again: the check says which run."""
    wrapper, generation = ready()
    fed = [0]

    def leaky(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Flat:
        ids = kwargs["input_ids"]
        positions = torch.arange(fed[0], fed[0] + ids.shape[1])
        fed[0] += ids.shape[1]
        with torch.no_grad():
            return [wrapper(input_ids=ids, cache_position=positions)]

    check = runner_check(leaky, generation)
    assert check.first_mismatch is None and check.generated == check.expected
    assert not check.matched and not check.runs[0].matched
    details = mismatch_details(check)
    assert (details["run"], details["prompt"], details["restart"]) == (1, "second", True)
    assert details["first_mismatch"] == check.runs[0].first_mismatch
    error = mismatch_error(check)
    assert error.code == "verification_failed"
    assert error.details["reason"] == "generation_mismatch" and error.details["run"] == 1


CONSTANT = [59, 59, 59, 8, 73] + [65] * 11
"""What eager transformers generates from the example prompt of the docs' tiny Llama."""
VARIED = [51, 91, 91, 91, 51, 91, 91, 25, 73, 50, 92, 41, 73, 85, 73, 9]
"""The same model's tokens from the second prompt."""


def test_a_nearly_constant_reference_warns() -> None:
    assert nearly_constant(CONSTANT)  # one token is 11 of 16
    assert nearly_constant([1, 2] * 8)  # half of them
    assert nearly_constant([1, 2, 3] * 5 + [1])  # 3 distinct of 16: a short cycle
    assert not nearly_constant(VARIED)
    assert not nearly_constant([5, 5, 5])  # too short to judge
    runs = [
        GenerationRun(prompt="second", matched=True, expected=VARIED, generated=VARIED),
        GenerationRun(prompt="example", matched=True, expected=CONSTANT, generated=CONSTANT),
    ]
    check = GenerationCheck(
        max_new_tokens=16,
        prompt_tokens=16,
        matched=True,
        expected=CONSTANT,
        generated=CONSTANT,
        prompt_ids=list(range(16)),
        runs=runs,
    )
    [warning] = constant_warnings(check)
    assert warning.code == "generation_nearly_constant"
    assert warning.details["prompt"] == "example" and warning.details["prompt_ids"] == list(
        range(16)
    )
    assert (warning.details["token"], warning.details["count"]) == (65, 11)
    assert warning.details["distinct"] == 4 and warning.details["tokens"] == CONSTANT
    varied = check.model_copy(update={"expected": VARIED, "runs": runs[:1]})
    assert constant_warnings(varied) == []


def test_a_position_past_the_cache_is_refused_with_the_bound() -> None:
    wrapper, generation = ready()
    size = generation.max_cache_len
    with torch.no_grad():
        last = wrapper(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([size - 1]))
        assert last.shape == (1, 1, 96)
        with pytest.raises(RuntimeError) as raised:
            wrapper(input_ids=torch.tensor([[1]]), cache_position=torch.tensor([size]))
    assert str(raised.value) == CACHE_BOUND_MESSAGE.format(last=size - 1, size=size)
    # the buffers keep transformers' names (signature.json and the docs name them)
    assert {"key_cache_0", "value_cache_1"} <= dict(wrapper.named_buffers()).keys()


@pytest.mark.slow  # one ONNX conversion of a tiny LLM: about 30 s on 2 shared cores
def test_the_onnx_llm_takes_position_ids_and_carries_no_node_metadata(tmp_path: Path) -> None:
    """optimum's `ORTModelForCausalLM` (not installed here: optimum-onnx pins
    transformers<4.58) feeds `position_ids` [batch_size, sequence_length] int64 by name
    and calls a model without it legacy; the model must read them."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from engine.generation import onnx_past
    from engine.targets import onnx as onnx_target

    _, generation = ready()
    made = onnx_past.past_program(generation)
    path, facts = tmp_path / "model.onnx", {}
    onnx_target.convert(
        made.program,
        (),
        made.kwargs,
        path,
        facts=facts,
        input_names=made.input_names,
        output_names=made.output_names,
        dim_names=made.dim_names,
    )
    assert facts["inputs"][:3] == ["input_ids", "attention_mask", "position_ids"]
    assert facts["input_shapes"]["position_ids"] == ["batch_size", "sequence_length"]
    model = onnx.load(path)
    [positions] = [value for value in model.graph.input if value.name == "position_ids"]
    assert positions.type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert [node.op_type for node in model.graph.node if node.metadata_props] == []
    run = onnx_target.load(path, made.program, facts["inputs"], facts["outputs"])

    def prefill(offset: int) -> torch.Tensor:
        heads, head_dim = made.past_shape
        empty = torch.zeros(1, heads, 0, head_dim)
        feed = {
            "input_ids": generation.prompt,
            "attention_mask": torch.ones(1, PROMPT_TOKENS, dtype=torch.long),
            "position_ids": torch.arange(offset, offset + PROMPT_TOKENS).unsqueeze(0),
            "past_key_values": [(empty, empty)] * made.layers,
        }
        logits: torch.Tensor = run((), feed)[0]
        return logits

    assert not torch.allclose(prefill(0), prefill(5))  # the model reads its positions
    check = onnx_check(run, made, generation)
    assert check.matched and [r.prompt for r in check.runs] == ["second", "example"]
