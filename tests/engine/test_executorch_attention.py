"""A generation-ready LLM's ExecuTorch form (`engine.targets.executorch_attention`):
ExecuTorch's `llama::update_cache` and `llama::custom_sdpa` in place of the recipe's
cache writes and masked attention over the whole cache; the same logits as the wrapper at
every position, the wrapper itself left as it was, and the recipe's form kept, with the
reason, for models the ops do not fit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from engine.generation.ready import make_ready
from engine.targets import executorch_attention
from schemas import GenerationOptions
from tests.engine.test_checkpoints import export, zip_directory
from tests.engine.test_generation import TEXT_GENERATION, config_of, llama

transformers = pytest.importorskip("transformers")
pytest.importorskip("executorch")


def wrapper_of(kind: str = "llama", dtype: torch.dtype = torch.float32, **changes: Any) -> Any:
    torch.manual_seed(0)
    config = config_of(kind)
    for name, value in changes.items():
        setattr(config, name, value)
    classes = {"llama": transformers.LlamaForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}
    model = classes[kind](config).eval().to(dtype)
    wrapper, generation, kwargs, _ = make_ready(model, config, GenerationOptions())
    return wrapper, generation, kwargs


def steps(module: torch.nn.Module, prompt: torch.Tensor, tokens: int) -> list[torch.Tensor]:
    """The logits of a prefill and `tokens` greedy decode steps, from position 0."""
    logits = [module(input_ids=prompt, cache_position=torch.arange(prompt.shape[1]))]
    position = prompt.shape[1]
    for _ in range(tokens):
        token = logits[-1][:, -1:].argmax(-1)
        logits.append(module(input_ids=token, cache_position=torch.tensor([position])))
        position += 1
    return logits


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_form_gives_the_wrappers_logits_and_leaves_the_wrapper_as_it_was(kind: str) -> None:
    wrapper, generation, kwargs = wrapper_of(kind)
    assert executorch_attention.unsuited(wrapper, float32=True) is None
    shapes = {name: buffer.shape for name, buffer in wrapper.named_buffers()}
    form = executorch_attention.form(wrapper)
    # the form's cache is [batch, position, heads, head_dim]; the wrapper's stays
    assert form.key_cache_0.shape == (1, generation.max_cache_len, 2, 8)
    assert wrapper.key_cache_0.shape == (1, 2, generation.max_cache_len, 8)
    assert {name: buffer.shape for name, buffer in wrapper.named_buffers()} == shapes
    assert wrapper.model.config._attn_implementation == "sdpa"
    assert form.model.model.embed_tokens.weight is wrapper.model.model.embed_tokens.weight
    prompt, second = kwargs["input_ids"], generation.second.ids
    with torch.no_grad():
        for ids in (prompt, second, prompt):  # each from position 0 on the same cache
            for want, got in zip(steps(wrapper, ids, 6), steps(form, ids, 6), strict=True):
                torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_the_exported_form_attends_through_the_op_in_every_layer() -> None:
    wrapper, generation, kwargs = wrapper_of()
    form = executorch_attention.form(wrapper)
    program = executorch_attention.export(form, kwargs, generation.max_cache_len)
    assert executorch_attention.lowered_attention(program) == 2
    writes = [
        node
        for node in program.graph.nodes
        if node.op == "call_function" and "update_cache" in str(node.target)
    ]
    assert len(writes) == 4  # keys and values of each layer
    assert [spec.arg.name for spec in program.graph_signature.input_specs][-2:] == [
        "input_ids",
        "cache_position",
    ]


@pytest.mark.parametrize(
    ("changes", "dtype", "float32", "reason"),
    [
        ({"sliding_window": 8}, torch.float32, True, "slides over 8 of the cache's 64"),
        ({"attn_logit_softcapping": 50.0}, torch.float32, True, "soft-capped"),
        ({"attention_chunk_size": 16}, torch.float32, True, "chunked"),
        ({}, torch.bfloat16, False, "reduced precision"),
    ],
)
def test_a_model_the_ops_do_not_fit_keeps_the_recipes_attention(
    changes: dict[str, Any], dtype: torch.dtype, float32: bool, reason: str
) -> None:
    wrapper, _, _ = wrapper_of(dtype=dtype, **changes)
    said = executorch_attention.unsuited(wrapper, float32=float32)
    assert said is not None and reason in said


def test_a_bfloat16_model_widened_for_the_target_takes_the_ops() -> None:
    wrapper, _, _ = wrapper_of(dtype=torch.bfloat16)
    assert executorch_attention.unsuited(wrapper, float32=True) is None


def test_a_window_the_cache_never_reaches_does_not_matter() -> None:
    wrapper, _, _ = wrapper_of(sliding_window=4096)
    assert executorch_attention.unsuited(wrapper, float32=True) is None


@pytest.mark.slow
@pytest.mark.parametrize("why", ["export fails", "option off"])
def test_without_the_form_the_recipes_pte_is_lowered_and_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, why: str
) -> None:
    def fails(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("no such op")

    options: dict[str, Any] = {
        **TEXT_GENERATION,
        "targets": ["executorch"],
        "profile": {"enabled": False},
    }
    if why == "export fails":
        monkeypatch.setattr(executorch_attention, "export", fails)
    else:
        options["executorch"] = {"custom_ops": False}
    archive = zip_directory(llama(tmp_path), tmp_path / "model.zip")
    target = export(tmp_path, archive, options).report.targets["executorch"]
    assert target.status == "succeeded", target.error
    assert target.details["attention"] == "recipe"
    reason = target.details["attention_reason"]
    if why == "export fails":
        assert "RuntimeError: no such op" in reason
    else:
        assert reason == "executorch.custom_ops is false"
    assert "llama.custom_sdpa.default" not in target.details["portable_ops"]
    assert target.generation is not None and target.generation.matched
    assert target.runtime_generation is not None and target.runtime_generation.passed


def test_the_pte_refuses_a_position_outside_the_cache_before_it_writes(tmp_path: Path) -> None:
    """ExecuTorch drops the program's checks when it lowers, and its `update_cache` would
    write a negative position before its buffer: the form's own `gather` refuses it."""
    from engine.targets import executorch

    wrapper, generation, kwargs = wrapper_of()
    form = executorch_attention.form(wrapper)
    program = executorch_attention.export(form, kwargs, generation.max_cache_len)
    path = executorch.convert(program, (), kwargs, tmp_path / "model.pte")
    run = executorch.load(path, program)
    size = generation.max_cache_len
    first = run((), {"input_ids": torch.tensor([[1]]), "cache_position": torch.tensor([0])})
    assert first[0].shape == (1, 1, 96)
    for outside in (-1, -size, size, size + 5):
        past = {"input_ids": torch.tensor([[1]]), "cache_position": torch.tensor([outside])}
        with pytest.raises(RuntimeError, match="0x12"):
            run((), past)
    # two new tokens from the last position run past the cache's end
    last = {"input_ids": torch.tensor([[1, 2]]), "cache_position": torch.tensor([size - 1, size])}
    with pytest.raises(RuntimeError, match="0x12"):
        run((), last)


def bfloat16_llama(tmp_path: Path) -> Path:
    """The tiny Llama of `llama`, saved in bfloat16."""
    torch.manual_seed(0)
    config = config_of("llama")
    config.dtype = torch.bfloat16
    directory = tmp_path / "llama-bf16"
    transformers.LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(directory)
    return directory


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "model"])
def test_a_bfloat16_llm_is_lowered_in_float32_with_the_ops_unless_asked_not_to(
    tmp_path: Path, dtype: str
) -> None:
    """`executorch.dtype`: by default a bfloat16 LLM's `.pte` computes in float32 from
    widened weights, as optimum-executorch loads it, and attends through the ops; with
    `model` it keeps bfloat16 and the recipe's attention. Either is verified against the
    bfloat16 eager model and generates its tokens."""
    options: dict[str, Any] = {
        **TEXT_GENERATION,
        "targets": ["executorch"],
        "profile": {"enabled": False},
        "executorch": {"dtype": dtype},
    }
    archive = zip_directory(bfloat16_llama(tmp_path), tmp_path / "model.zip")
    result = export(tmp_path, archive, options)
    target = result.report.targets["executorch"]
    assert target.status == "succeeded", target.error
    assert target.verification is not None and target.verification.verdict == "verified"
    if dtype == "float32":
        assert target.details["attention"] == "llama::custom_sdpa"
        assert target.details["widened_from"] == "bfloat16"
        assert target.details["portable_ops"]["llama.custom_sdpa.default"] == 2
    else:
        assert target.details["attention"] == "recipe"
        assert "reduced precision" in target.details["attention_reason"]
        assert "widened_from" not in target.details
    assert target.generation is not None and target.generation.matched
    assert target.runtime_generation is not None and target.runtime_generation.passed


def test_a_widened_copy_keeps_ties_and_caches_and_leaves_the_model_as_it_was() -> None:
    from engine.load import module_copies

    wrapper, _, _ = wrapper_of(dtype=torch.bfloat16, tie_word_embeddings=True)
    wide = module_copies.widened(wrapper)
    assert {p.dtype for p in wide.parameters()} == {torch.float32}
    assert {p.dtype for p in wrapper.parameters()} == {torch.bfloat16}
    model = wide.model
    assert model.lm_head.weight is model.model.embed_tokens.weight  # one float32 table
    assert torch.equal(model.lm_head.weight, wrapper.model.lm_head.weight.float())
    layer = wide.static_cache.layers[0]
    assert layer.keys.dtype == torch.float32
    assert any(buffer is layer.keys for buffer in wide.buffers())  # still the wrapper's
    prompt = {"input_ids": torch.tensor([[3, 5, 7]]), "cache_position": torch.arange(3)}
    with torch.no_grad():
        got, want = wide(**prompt), wrapper(**prompt)
    assert got.dtype == torch.float32
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.float().flatten(), 0) > 0.99
