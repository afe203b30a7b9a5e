"""Generation-ready encoder-decoder models: a `text2text-generation` or speech-to-text
checkpoint exported as two programs (an encoder, and a decoder with a static KV cache),
verified by greedy generation against eager transformers (issue 20).

The tiny models' weights are redrawn wide (`widen`): at transformers' default init a tiny
random decoder repeats one token whatever it has seen, and a generation check on it
would prove nothing (`test_the_test_models_depend_on_what_they_have_seen`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.generation.seq2seq import eager_seq2seq_tokens
from tests.engine.test_checkpoints import export, zip_directory

transformers = pytest.importorskip("transformers")

SEQ2SEQ = {"task": "text2text-generation", "verify": {"roundtrip": False}}


def widen(model: torch.nn.Module) -> torch.nn.Module:
    """Redraw every matrix at twice the 1/sqrt(fan-in) scale (seeded)."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() >= 2:
                scale = 2.0 / parameter.shape[-1] ** 0.5
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * scale)
    return model


def t5(tmp_path: Path) -> Path:
    config = transformers.T5Config(
        vocab_size=96,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        pad_token_id=0,
        eos_token_id=1,
        n_positions=64,  # T5's positions are relative: this bounds encoder_sequence_length
    )
    directory = tmp_path / "t5"
    widen(transformers.T5ForConditionalGeneration(config)).save_pretrained(directory)
    return directory


def whisper(tmp_path: Path) -> Path:
    config = transformers.WhisperConfig(
        vocab_size=96,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=16,
        max_source_positions=24,
        max_target_positions=48,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )
    directory = tmp_path / "whisper"
    widen(transformers.WhisperForConditionalGeneration(config)).save_pretrained(directory)
    return directory


def test_a_t5_checkpoint_exports_an_encoder_and_a_cached_decoder(tmp_path: Path) -> None:
    archive = zip_directory(t5(tmp_path), tmp_path / "t5.zip", folder=None)
    result = export(tmp_path, archive, {"verify": {"roundtrip": True}})
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None
    assert report.checkpoint.task == "text2text-generation"
    made = report.generation
    assert made is not None and made.encoder is not None
    assert made.inputs == ["decoder_input_ids", "encoder_hidden_states", "cache_position"]
    assert made.encoder.inputs == ["input_ids"]
    assert made.encoder.input_shape == [1, "encoder_sequence_length"]
    check = made.check
    assert check is not None and check.matched and check.generated == check.expected
    assert check.max_new_tokens == 16 and len(set(check.expected)) >= 3
    # each run's encoder input is recorded: the example's, another one, the example again
    assert check.prompt_ids == [0] and len(check.encoder_input_ids or []) == 16
    assert [(r.prompt, len(r.encoder_input_ids or []), r.matched) for r in check.runs] == [
        ("second", 7, True),
        ("example", 16, True),
    ]
    assert check.runs[0].expected != check.expected
    verified = made.encoder.verification
    assert verified is not None and verified.verdict == "verified" and verified.checked >= 3
    # samples over the encoder's length, by its name
    lengths = {s.symbols.get("encoder_sequence_length") for s in verified.samples}
    assert {1, 64} <= lengths
    assert made.encoder.roundtrip is not None and made.encoder.roundtrip.status == "passed"
    assert report.verification is not None and report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    names = {artifact.name for artifact in report.artifacts}
    assert {"program.pt2", "encoder.pt2"} <= names
    # both programs load with torch alone and generate eager's tokens for another input
    encoder = torch.export.load(result.artifacts["encoder.pt2"]).module()
    decoder = torch.export.load(result.artifacts["program.pt2"]).module()
    model = transformers.T5ForConditionalGeneration.from_pretrained(tmp_path / "t5").eval()
    source = torch.tensor([[5, 17, 33, 2, 71, 9, 40]])
    expected = eager_seq2seq_tokens(model, {"input_ids": source}, 0, 8)
    with torch.no_grad():
        hidden = encoder(input_ids=source)
        token, got = torch.tensor([[0]]), []
        for position in range(8):
            logits = decoder(
                decoder_input_ids=token,
                encoder_hidden_states=hidden,
                cache_position=torch.tensor([position]),
            )
            token = logits[:, -1:].argmax(-1)
            got.append(int(token))
    assert got == expected
    signature = json.loads(result.artifacts["signature.json"].read_text())
    user = [i["name"] for i in signature["inputs"] if i["kind"] == "user_input"]
    assert user == ["decoder_input_ids", "encoder_hidden_states", "cache_position"]


def test_a_whisper_checkpoint_exports_a_speech_encoder_and_a_cached_decoder(
    tmp_path: Path,
) -> None:
    archive = zip_directory(whisper(tmp_path), tmp_path / "whisper.zip", folder=None)
    result = export(tmp_path, archive, {"verify": {"roundtrip": False}})
    report = result.report
    assert result.succeeded, report.error
    assert report.checkpoint is not None
    assert report.checkpoint.task == "automatic-speech-recognition"
    made = report.generation
    assert made is not None and made.encoder is not None
    assert made.encoder.inputs == ["input_features"]
    assert made.encoder.input_shape == [1, 16, 48]  # Whisper's window: twice the source positions
    assert made.max_cache_len == 48  # the decoder's context (max_target_positions)
    check = made.check
    assert check is not None and check.matched and len(set(check.expected)) >= 3
    assert [r.prompt for r in check.runs] == ["second", "example"]  # other features second
    assert check.encoder_input_ids is None and all(r.matched for r in check.runs)


def test_the_test_models_depend_on_what_they_have_seen(tmp_path: Path) -> None:
    """A decoder that forgot its cache, or saw another encoder output, would generate
    other tokens: so matching eager's tokens means something."""
    model = transformers.T5ForConditionalGeneration.from_pretrained(t5(tmp_path)).eval()
    source = torch.randint(2, 96, (1, 16), generator=torch.Generator().manual_seed(0))
    tokens = eager_seq2seq_tokens(model, {"input_ids": source}, 0, 16)
    other = eager_seq2seq_tokens(model, {"input_ids": source.flip(1)}, 0, 16)
    assert tokens != other
    with torch.no_grad():  # each step alone, no cache: another sequence
        encoded = model.get_encoder()(input_ids=source)
        forgetful, token = [], torch.tensor([[0]])
        for _ in range(16):
            logits = model(encoder_outputs=encoded, decoder_input_ids=token).logits
            token = logits[:, -1:].argmax(-1)
            forgetful.append(int(token))
    assert forgetful != tokens


def test_cache_off_keeps_the_plain_forward(tmp_path: Path) -> None:
    archive = zip_directory(t5(tmp_path), tmp_path / "t5.zip", folder=None)
    result = export(tmp_path, archive, {**SEQ2SEQ, "generation": {"cache": False}})
    assert result.succeeded, result.report.error
    assert result.report.generation is None
    assert "encoder.pt2" not in result.artifacts
    inputs = [i.name for i in result.report.inputs]
    assert inputs == ["input_ids", "attention_mask", "decoder_input_ids"]


@pytest.mark.parametrize(
    ("generation", "reason"),
    [
        ({"max_cache_len": 128}, "cache_too_long"),  # over the decoder's 64 positions
        ({"max_cache_len": 32, "max_new_tokens": 40}, "cache_too_short"),
    ],
)
def test_a_decoder_cache_it_cannot_take_is_refused(
    tmp_path: Path, generation: dict[str, int], reason: str
) -> None:
    archive = zip_directory(t5(tmp_path), tmp_path / "t5.zip", folder=None)
    result = export(tmp_path, archive, {**SEQ2SEQ, "generation": generation})
    error = result.report.error
    assert error is not None and error.code == "invalid_request"
    assert error.details["reason"] == reason and error.stage == "loading"


@pytest.mark.slow
@pytest.mark.timeout(600)  # six conversions (two programs, three targets) on 2 shared cores
def test_every_target_converts_both_programs_and_generates_eagers_tokens(
    tmp_path: Path,
) -> None:
    onnx = pytest.importorskip("onnx")
    archive = zip_directory(t5(tmp_path), tmp_path / "t5.zip", folder=None)
    # XNNPACK and AOTInductor reorder the encoder's reductions: on these wide test
    # weights its output differs by up to 1.6e-5 at length 64 (float32 noise).
    options = {
        "targets": ["onnx", "aoti", "executorch"],
        "verify": {"roundtrip": False, "atol": 1e-4},
        "profile": {"enabled": False},  # profiles: tests/engine/test_profiling.py
    }
    result = export(tmp_path, archive, options)
    report = result.report
    assert result.succeeded, report.error
    expected = (
        report.generation.check.expected if report.generation and report.generation.check else []
    )
    assert len(set(expected)) >= 3
    for name in ("onnx", "aoti", "executorch"):
        target = report.targets[name]
        assert target.status == "succeeded", target.error
        assert target.generation is not None and target.generation.matched
        assert target.generation.generated == expected
        assert target.encoder is not None and target.encoder.verdict == "verified"
        assert target.encoder.checked is not None and target.encoder.checked >= 3
    assert report.targets["onnx"].artifacts == [  # an LLM's weights: external data
        "model.onnx", "model.onnx.data", "encoder.onnx", "encoder.onnx.data"
    ]  # fmt: skip
    assert report.targets["aoti"].artifacts == ["model.aoti.pt2", "encoder.aoti.pt2"]
    assert report.targets["executorch"].details["methods"] == ["text_decoder", "encoder"]
    assert {"encoder.onnx", "encoder.aoti.pt2", "model.pte"} <= set(result.artifacts)

    def names(path: Path) -> tuple[list[str], list[str], set[str], dict[str, str]]:
        graph = onnx.load(path).graph
        dims = {
            d.dim_param
            for value in [*graph.input, *graph.output]
            for d in value.type.tensor_type.shape.dim
            if d.dim_param
        }
        metadata = {p.key: p.value for p in onnx.load(path).metadata_props}
        return [i.name for i in graph.input], [o.name for o in graph.output], dims, metadata

    inputs, outputs, dims, metadata = names(result.artifacts["encoder.onnx"])
    assert (inputs, outputs) == (["input_ids"], ["last_hidden_state"])
    assert dims == {"encoder_sequence_length"}
    inputs, outputs, dims, metadata = names(result.artifacts["model.onnx"])
    past = [f"past_key_values.{i}.decoder.{part}" for i in range(2) for part in ("key", "value")]
    assert inputs == ["input_ids", "encoder_hidden_states", *past]
    assert outputs == ["logits"] + [name.replace("past_key_values", "present") for name in past]
    assert {"batch_size", "decoder_sequence_length", "encoder_sequence_length"} <= dims
    assert "past_decoder_sequence_length" in dims
    assert metadata["torchport.task"] == "text2text-generation-with-past"
