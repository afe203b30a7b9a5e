"""Generation-ready LLMs: a `text-generation` checkpoint exported with a static KV cache
and verified by greedy generation against eager transformers (issue 20).

Tiny configs saved here; the slow tests run every target (onnx with past_key_values,
aoti, executorch) and compare their tokens too."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.generation import greedy
from engine.generation.ready import CACHE_BOUND_MESSAGE
from tests.engine.test_checkpoints import export, zip_directory

transformers = pytest.importorskip("transformers")

TEXT_GENERATION = {"task": "text-generation", "verify": {"roundtrip": False}}

CONTEXT = 0.2
"""`initializer_range` of the test models. At transformers' default (0.02) a tiny random
model's next token depends almost only on the current one, so a program that lost its
cache would still generate eager's tokens; at 0.2 it does not (checked below)."""


def config_of(kind: str) -> Any:
    common = {
        "vocab_size": 96,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "initializer_range": CONTEXT,
    }
    if kind == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=8)
    return transformers.LlamaConfig(**common)


def saved_lm(tmp_path: Path, kind: str) -> Path:
    torch.manual_seed(0)
    config = config_of(kind)
    model_class = (
        transformers.Qwen3ForCausalLM if kind == "qwen3" else transformers.LlamaForCausalLM
    )
    directory = tmp_path / kind
    model_class(config).save_pretrained(directory)
    return directory


def llama(tmp_path: Path) -> Path:
    return saved_lm(tmp_path, "llama")


def qwen3(tmp_path: Path) -> Path:
    """A tiny Qwen3: tests/sandbox/test_generation.py exports it in the sandbox."""
    return saved_lm(tmp_path, "qwen3")


def runtime_mismatch(target: Any) -> None:
    """`target` failed on its first token in its runtime's own generation loop."""
    assert target.status == "failed"
    assert target.error is not None and target.error.code == "target_failed"
    assert target.error.details["reason"] == "generation_mismatch"
    assert target.error.details["runtime"] is True
    assert target.error.details["first_mismatch"] == 0
    assert target.runtime_generation is not None and target.runtime_generation.passed is False


def test_a_llama_checkpoint_exports_with_a_static_cache_and_generates(tmp_path: Path) -> None:
    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip", folder=None)
    result = export(tmp_path, archive, {"task": "text-generation"})
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None and report.checkpoint.model_class == "LlamaForCausalLM"
    made = report.generation
    assert made is not None
    assert (made.cache, made.max_cache_len, made.batch_size) == ("static", 64, 1)
    assert len(set(made.check.expected if made.check else [])) >= 3  # not one token repeated
    assert made.inputs == ["input_ids", "cache_position"]
    check = made.check
    assert check is not None and check.matched and check.first_mismatch is None
    assert check.max_new_tokens == 16 and len(check.generated) == 16
    assert check.generated == check.expected
    # a second prompt and the example again, each from position 0 on the same program
    assert len(check.prompt_ids) == 16
    assert [(run.prompt, len(run.prompt_ids), run.matched) for run in check.runs] == [
        ("second", 7, True),
        ("example", 16, True),
    ]
    # this model's reference from the example prompt is nearly constant (one token 11 of 16)
    warned = [w.details for w in report.warnings if w.code == "generation_nearly_constant"]
    assert [(w["prompt"], w["count"]) for w in warned] == [("example", 11)]
    # the example (a prefill of 16 tokens) is the one sample; no random cache positions
    assert report.verification is not None and report.verification.verdict == "verified"
    assert [s.label for s in report.verification.samples] == ["example"]
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    assert [i.name for i in report.inputs] == ["input_ids", "cache_position"]
    # traced non-strict (the weights' values never read), the cache's writes captured
    assert report.tracing.strict_used is False
    assert [a.strict for a in report.tracing.attempts] == [False]
    signature = json.loads((tmp_path / "out" / "signature.json").read_text())
    mutated = {o["target"] for o in signature["outputs"] if o["kind"] == "buffer_mutation"}
    assert {"key_cache_0", "value_cache_0"} <= mutated
    # the saved program starts with an empty cache and generates the same tokens
    program = torch.export.load(tmp_path / "out" / "program.pt2")
    cache = dict(program.named_buffers())["key_cache_0"]
    assert cache.shape[2] == 64 and not cache.any()
    module = program.module()
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])  # another prompt than the example's
    eager = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "llama").eval()
    assert greedy.cached_tokens(
        lambda ids, pos: module(input_ids=ids, cache_position=pos), prompt, 8
    ) == greedy.eager_tokens(eager, prompt, 8)
    # a position past the cache is refused with the bound, not an IndexError deep inside
    with pytest.raises(RuntimeError) as raised:
        module(input_ids=prompt[:, :1], cache_position=torch.tensor([64]))
    assert str(raised.value) == CACHE_BOUND_MESSAGE.format(last=63, size=64)


def test_the_cache_length_and_token_count_are_options(tmp_path: Path) -> None:
    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip")
    options = {**TEXT_GENERATION, "generation": {"max_cache_len": 40, "max_new_tokens": 5}}
    result = export(tmp_path, archive, options)
    report = result.report
    assert result.succeeded, report.error
    assert report.generation is not None and report.generation.max_cache_len == 40
    assert report.generation.check is not None
    assert len(report.generation.check.generated) == 5 and report.generation.check.matched
    applied = report.tracing.dynamic_shapes.applied
    assert isinstance(applied, dict)
    sequence = applied["input_ids"]["1"]
    assert (sequence.name, sequence.min, sequence.max) == ("sequence_length", 1, 40)


@pytest.mark.parametrize(
    ("generation", "reason"),
    [
        ({"max_cache_len": 128}, "cache_too_long"),
        ({"max_cache_len": 32, "max_new_tokens": 17}, "cache_too_short"),
    ],
)
def test_a_cache_the_model_cannot_take_is_invalid_request(
    tmp_path: Path, generation: dict[str, Any], reason: str
) -> None:
    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip")
    result = export(tmp_path, archive, {**TEXT_GENERATION, "generation": generation})
    error = result.report.error
    assert error is not None and error.code == "invalid_request"
    assert error.details["reason"] == reason
    assert error.stage == "loading"


def test_without_verification_the_cache_is_reported_unchecked(tmp_path: Path) -> None:
    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip")
    options = {"task": "text-generation", "verify": {"enabled": False}}
    result = export(tmp_path, archive, options)
    assert result.succeeded, result.report.error
    assert result.report.generation is not None
    assert result.report.generation.check is None


def test_an_uploaded_inputs_file_keeps_the_plain_forward(tmp_path: Path) -> None:
    from engine.load.model import Upload
    from engine.pipeline.export import ExportRequest, run_export
    from schemas import ExportOptions

    archive = zip_directory(llama(tmp_path), tmp_path / "llama.zip")
    inputs = tmp_path / "inputs.pt"
    torch.save({"args": [], "kwargs": {"input_ids": torch.ones(1, 5, dtype=torch.long)}}, inputs)
    result = run_export(
        ExportRequest(
            upload=Upload(model=archive, inputs=inputs),
            options=ExportOptions.model_validate({**TEXT_GENERATION, "verify": {"samples": 0}}),
            out_dir=tmp_path / "out",
            work_dir=tmp_path / "work",
        )
    )
    assert result.succeeded, result.report.error
    assert result.report.generation is None
    assert [i.name for i in result.report.inputs] == ["input_ids"]


def test_the_check_finds_the_first_differing_token() -> None:
    made = greedy.check([5, 6, 7, 8], lambda: [5, 6, 9, 8], prompt_tokens=3)
    assert (made.matched, made.first_mismatch) == (False, 2)
    assert greedy.check([5, 6], lambda: [5, 6], 3).first_mismatch is None
    assert greedy.check([5, 6, 7], lambda: [5, 6], 3).first_mismatch == 2


def test_a_runtime_that_loses_the_cache_is_caught(tmp_path: Path) -> None:
    """A runner that forgets the cache between calls (a decode step then sees only its
    own token) generates other tokens: the check says where."""
    from engine.generation import Generation, runner_check
    from engine.generation.ready import make_ready
    from schemas import GenerationOptions

    torch.manual_seed(0)
    config = config_of("llama")
    model = transformers.LlamaForCausalLM(config).eval()
    wrapper, generation, _, _ = make_ready(model, config, GenerationOptions(max_new_tokens=8))
    assert isinstance(generation, Generation)
    import copy

    pristine = copy.deepcopy(wrapper)

    def forgetful(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        fresh = copy.deepcopy(pristine)
        with torch.no_grad():
            return [fresh(input_ids=kwargs["input_ids"], cache_position=kwargs["cache_position"])]

    def faithful(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        with torch.no_grad():
            return [wrapper(**kwargs)]

    assert runner_check(faithful, generation).matched
    calls: list[int] = []

    def counted(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
        calls.append(int(kwargs["cache_position"][0]))
        return forgetful(args, kwargs)

    lost = runner_check(counted, generation)
    assert not lost.matched and lost.first_mismatch is not None and lost.first_mismatch >= 1
    # each run stops at its first differing token: the rest would never be compared
    runs = [(lost.generated, lost.first_mismatch)]
    runs += [(run.generated, run.first_mismatch) for run in lost.runs]
    for generated, index in runs:
        assert len(generated) == (8 if index is None else index + 1)
    assert len(calls) == sum(len(generated) for generated, _ in runs)


def _target_generation(tmp_path: Path, directory: Path) -> dict[str, Any]:
    archive = zip_directory(directory, tmp_path / "model.zip")
    options = {
        **TEXT_GENERATION,
        "targets": ["onnx", "aoti", "executorch"],
        "profile": {"enabled": True, "runs": 2, "warmup": 1, "budget_s": 10},
    }
    result = export(tmp_path, archive, options)
    report = result.report
    assert result.succeeded, report.error
    assert report.generation is not None and report.generation.check is not None
    assert report.generation.check.matched
    for name in ("onnx", "aoti", "executorch"):
        target = report.targets[name]
        assert target.status == "succeeded", (name, target.error)
        assert target.generation is not None, name
        assert target.generation.matched, (name, target.generation)
        assert target.generation.expected == report.generation.check.expected
        # the second prompt and the restart ran on the loaded artifact too
        assert target.generation.runs == report.generation.check.runs, name
    # each runtime's own generation loop on the artifacts as delivered
    for name in ("onnx", "executorch"):
        in_runtime = report.targets[name].runtime_generation
        assert in_runtime is not None and in_runtime.passed is True, name
    # decode steps timed at two positions, ONNX's after a past of that many as inputs
    assert report.profile is not None
    size = report.generation.max_cache_len
    for row in report.profile.artifacts:
        assert row.status == "measured", (row.name, row.error)
        for latency in row.latency:
            positions = [step.position for step in latency.decode]
            assert positions == [size // 8, size - size // 8], row.name
            for step in latency.decode:
                assert step.runs >= 1 and 0 < step.min_ms <= step.p50_ms <= step.max_ms
    # past max_cache_len: AOTInductor raises the program's error; ExecuTorch removes
    # assertions and its runtime refuses the index (error 0x12)
    from torch._inductor import aoti_load_package

    aoti = aoti_load_package(str(tmp_path / "out" / "model.aoti.pt2"))
    size = report.generation.max_cache_len
    past = {"input_ids": torch.tensor([[1]]), "cache_position": torch.tensor([size])}
    with pytest.raises(RuntimeError) as raised:
        aoti(**past)
    assert CACHE_BOUND_MESSAGE.format(last=size - 1, size=size) in str(raised.value)
    # ExecuTorch's LLM runner reads these constant methods from the .pte
    from executorch.runtime import Runtime

    pte = Runtime.get().load_program(str(tmp_path / "out" / "model.pte"))
    assert pte.load_method("get_max_seq_len").execute([]) == [report.generation.max_cache_len]
    assert pte.load_method("use_kv_cache").execute([]) == [True]
    assert report.targets["executorch"].details["constant_methods"]["get_n_layers"] == 2
    with pytest.raises(RuntimeError, match="0x12"):
        pte.load_method("forward").execute(list(past.values()))
    return report.targets["onnx"].details


@pytest.mark.slow
@pytest.mark.timeout(600)  # three conversions of a generation-ready LLM on 2 shared cores
def test_a_tiny_llama_generates_the_same_tokens_in_every_target(tmp_path: Path) -> None:
    facts = _target_generation(tmp_path, llama(tmp_path))
    assert facts["inputs"] == ["input_ids", "attention_mask", "position_ids"] + [
        f"past_key_values.{i}.{part}" for i in (0, 1) for part in ("key", "value")
    ]
    assert facts["outputs"] == ["logits"] + [
        f"present.{i}.{part}" for i in (0, 1) for part in ("key", "value")
    ]
    assert facts["input_shapes"]["input_ids"] == ["batch_size", "sequence_length"]
    assert facts["input_shapes"]["attention_mask"] == ["batch_size", "total_sequence_length"]
    assert facts["input_shapes"]["position_ids"] == ["batch_size", "sequence_length"]
    assert facts["input_shapes"]["past_key_values.0.key"][2] == "past_sequence_length"
    assert facts["output_shapes"]["present.0.key"][2] == "past_sequence_length + sequence_length"
    assert facts["metadata"]["torchport.task"] == "text-generation-with-past"
