"""Greedy tokens of a bfloat16 model that differ at a near tie pass the generation check,
reported as such (engine.generation.noise); a difference where eager is sure fails."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from engine.generation import checks, greedy  # noqa: E402
from engine.generation.noise import judged  # noqa: E402
from engine.generation.ready import Generation, Prompt  # noqa: E402

TIED = 7
"""The token whose output row is copied from eager's first choice: a perfect tie."""


def _model() -> tuple[torch.nn.Module, torch.Tensor, list[int]]:
    """A bfloat16 Llama and a prompt whose first greedy token has a twin (`TIED`) with
    exactly the same logit, in bfloat16 as in float32."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
        initializer_range=0.2,
    )
    model = transformers.LlamaForCausalLM(config).eval().to(torch.bfloat16)
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9]])
    first = greedy.eager_tokens(model, prompt, 1)[0]
    assert first != TIED
    with torch.no_grad():
        model.lm_head.weight[TIED] = model.lm_head.weight[first]
    return model, prompt, greedy.eager_tokens(model, prompt, 4)


def test_a_first_difference_at_a_tie_is_within_the_noise() -> None:
    model, prompt, expected = _model()
    assert expected[0] < TIED  # argmax takes the first of equal logits
    found = judged(model, prompt, expected, [TIED, *expected[1:]], 0)
    assert found["within_noise"] is True and found["margin"] == 0.0
    assert found["noise"] > 0.0  # eager's own bfloat16 error against float32


def test_a_difference_where_eager_is_sure_is_not() -> None:
    model, prompt, expected = _model()
    with torch.no_grad():
        logits = model(input_ids=prompt).logits[0, -1]
    worst = int(logits.argmin())
    found = judged(model, prompt, expected, [worst, *expected[1:]], 0)
    assert found["within_noise"] is False
    assert found["margin"] > 2 * found["noise"]


def test_the_check_passes_a_near_tie_and_reports_it() -> None:
    model, prompt, _ = _model()
    generation = Generation(
        model=model,
        prompt=prompt,
        max_new_tokens=4,
        max_cache_len=32,
        second=Prompt("second", torch.tensor([[2, 7, 1]])),
    )

    def tied(run: Prompt, _expected: list[int]) -> list[int]:
        tokens = checks.reference(generation, run)
        return [TIED, *tokens[1:]] if run.name == "example" else tokens

    result = checks.checked(generation, tied)
    assert result.matched is False and result.first_mismatch == 0
    assert result.within_noise is True and result.margin == 0.0
    assert result.passed is True
    assert [run.within_noise for run in result.runs] == [None, True]

    def wrong(run: Prompt, _expected: list[int]) -> list[int]:
        tokens = checks.reference(generation, run)
        return tokens if run.name == "example" else [(tokens[0] + 1) % 64, *tokens[1:]]

    result = checks.checked(generation, wrong)
    assert result.matched is False and result.passed is False
    assert result.runs[0].within_noise is False
    assert checks.mismatch_details(result)["prompt"] == "second"


def test_a_float32_model_is_not_judged_by_noise() -> None:
    model, prompt, _ = _model()
    model = model.float()
    generation = Generation(model=model, prompt=prompt, max_new_tokens=4, max_cache_len=32)
    result = checks.checked(
        generation, lambda run, _: [TIED, *checks.reference(generation, run)[1:]]
    )
    assert result.within_noise is None and result.passed is False
