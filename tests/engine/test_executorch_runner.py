"""A generation-ready LLM's `model.pte` runs as delivered in ExecuTorch's own LLM runner
(`engine.targets.executorch_llm`): the generation check run again by `TextLLMRunner`
(`report.targets.executorch.runtime_generation`) through a numbered tokenizer, and the
checkpoint's own tokenizer loaded by the runner; a model whose tokens differ there fails
the target."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engine.targets import executorch_llm
from engine.targets.executorch_llm import Numbered, numbered
from tests.engine.test_checkpoints import export, zip_directory
from tests.engine.test_generation import TEXT_GENERATION, llama, qwen3, runtime_mismatch

tokenizers = pytest.importorskip("tokenizers")

EXECUTORCH = {**TEXT_GENERATION, "targets": ["executorch"], "profile": {"enabled": False}}


def test_the_numbered_tokenizer_encodes_prompts_to_their_ids_and_names_every_id(
    tmp_path: Path,
) -> None:
    prompts = [[95, 94, 3, 10, 0], [7, 93]]
    made = numbered(96, prompts)
    assert made is not None
    # the base symbols: the highest ids no prompt uses, none a prefix of a number
    assert made.base == (92, 91, 90, 89, 88, 87, 86, 85, 84, 83, 82)
    tokenizer = tokenizers.Tokenizer.from_file(str(made.write(tmp_path / "tokenizer.json")))
    assert tokenizer.get_vocab_size() == 96
    for prompt in prompts:
        assert tokenizer.encode(made.text(prompt)).ids == prompt
    # every id's text, as the runner's callback gets it, names that id again
    pieces = [tokenizer.decode([token]) for token in range(96)]
    assert made.ids(pieces) == list(range(96))
    assert made.ids([" 96", "x", " 07", ""]) == [-1, -1, -1, -1]


def test_a_vocabulary_too_small_for_the_numbers_has_no_numbered_tokenizer() -> None:
    # the base symbols lie above a tenth of the vocabulary: 2 … 13 of 14
    assert numbered(14, [[13]]) == Numbered(14, tuple(range(12, 1, -1)))
    assert numbered(14, [[13, 5]]) is None
    assert numbered(8, [[0]]) is None
    with pytest.raises(AssertionError):
        Numbered(96, (95,) * 11).text([95])


def byte_level_tokenizer(directory: Path) -> None:
    """A small byte-level BPE `tokenizer.json`, as Llama 3's and GPT-2's are."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(["Export a model, run it anywhere."] * 4, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))


def _export(tmp_path: Path, kind: str) -> Any:
    directory = (llama if kind == "llama" else qwen3)(tmp_path)
    if kind == "llama":
        byte_level_tokenizer(directory)
    return export(tmp_path, zip_directory(directory, tmp_path / "model.zip"), EXECUTORCH)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_the_pte_generates_eagers_tokens_in_textllmrunner(tmp_path: Path, kind: str) -> None:
    result = _export(tmp_path, kind)
    target = result.report.targets["executorch"]
    assert target.status == "succeeded", target.error
    # attention through ExecuTorch's LLM ops, which the runner has the kernels of
    assert target.details["attention"] == "llama::custom_sdpa"
    assert target.details["portable_ops"]["llama.custom_sdpa.default"] == 2
    assert target.details["portable_ops"]["llama.update_cache.default"] == 4
    phases = target.details["phases_s"]
    assert list(phases) == ["program", "to_edge_transform_and_lower", "to_executorch", "write"]
    assert phases["program"] > 0 and phases["to_edge_transform_and_lower"] > 0
    assert all(seconds >= 0 for seconds in phases.values())
    assert sum(phases.values()) < target.duration_s
    # the runner's special tokens where the config names them (Llama's; Qwen3's has none)
    metadata = target.details["constant_methods"]
    special = {"get_bos_id": 1, "get_eos_ids": [2]} if kind == "llama" else {}
    assert {key: metadata[key] for key in metadata if key in ("get_bos_id", "get_eos_ids")} == (
        special
    )
    in_runtime = target.runtime_generation
    assert in_runtime is not None and in_runtime.passed is True and in_runtime.matched
    check = target.generation
    assert check is not None and in_runtime.prompt_ids == check.prompt_ids
    # the runner stops at the end-of-sequence token: each run up to its first one
    for ran, eager in zip(
        [in_runtime, *in_runtime.runs],
        [check.expected, *[r.expected for r in check.runs]],
        strict=True,
    ):
        end = eager.index(2) + 1 if 2 in eager else len(eager)
        assert ran.expected == eager[:end] and ran.generated == eager[:end]
    assert [run.prompt for run in in_runtime.runs] == ["second", "example"]
    said = [note for note in target.notes if note.startswith("ExecuTorch's TextLLMRunner")]
    if kind == "llama":  # the checkpoint's tokenizer came back and the runner loads it
        assert "tokenizer.json" in result.artifacts
        assert said == [
            "ExecuTorch's TextLLMRunner loads it with the checkpoint's tokenizer.json: "
            "TextLLMRunner('model.pte', 'tokenizer.json')."
        ]
    else:
        assert said == []


@pytest.mark.slow
def test_tokens_that_differ_in_the_runner_fail_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's loop is checked, not assumed: a runner whose tokens are shifted by
    one in the vocabulary fails the float target."""
    real = Numbered.ids

    def shifted(self: Numbered, pieces: list[str]) -> list[int]:
        return [(token + 1) % self.vocab for token in real(self, pieces)]

    monkeypatch.setattr(Numbered, "ids", shifted)
    report = _export(tmp_path, "qwen3").report
    runtime_mismatch(report.targets["executorch"])


@pytest.mark.slow
def test_a_tokenizer_the_runner_cannot_read_is_a_note(tmp_path: Path) -> None:
    directory = qwen3(tmp_path)
    (directory / "tokenizer.json").write_text('{"model": {"type": "WordLevel"}}')
    result = export(tmp_path, zip_directory(directory, tmp_path / "model.zip"), EXECUTORCH)
    target = result.report.targets["executorch"]
    assert target.status == "succeeded", target.error
    assert target.runtime_generation is not None and target.runtime_generation.passed
    said = [note for note in target.notes if "TextLLMRunner cannot load" in note]
    assert len(said) == 1 and "tokenizer.json" in said[0]


def test_an_encoder_decoder_pte_is_not_run_by_the_text_runner() -> None:
    from engine.generation.ready import Generation

    class Encoded(Generation):
        def __init__(self) -> None:
            self.encoder = object()  # type: ignore[assignment]

    settings = {"constant_methods": {"get_vocab_size": 96}}
    assert executorch_llm.runtime_generation(Path("model.pte"), Encoded(), settings, []) is None
