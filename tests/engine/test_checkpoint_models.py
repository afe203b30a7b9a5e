"""Checkpoint uploads beyond text: a checkpoint with its own code (`auto_map`), speech
(Whisper, Wav2Vec2 CTC), object detection (YOLOS) and semantic segmentation (SegFormer)
(issue 20).

Tiny configs saved here; each exports, verifies, and has the named dims of the contract's
table (docs/contract.md §1, *Checkpoints*)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.test_checkpoints import dims, export, zip_directory

transformers = pytest.importorskip("transformers")

CHECKED = {"decomposition": {"mode": "none"}, "verify": {"samples": 1, "roundtrip": False}}
"""The example and one more sample: verification runs, the round trip is others' topic."""

BATCH = {"name": "batch_size", "min": 1, "max": 64}


def _saved(directory: Path, model_class: str, config_class: str, **config: Any) -> Path:
    torch.manual_seed(0)
    getattr(transformers, model_class)(
        getattr(transformers, config_class)(**config)
    ).save_pretrained(directory)
    return directory


def _exported(
    tmp_path: Path,
    directory: Path,
    built: tuple[str, str],
    inputs: list[tuple[str, list[int]]],
    options: dict[str, Any] | None = None,
) -> Any:
    """The export of `directory`, succeeded, for the task and class `built` names, with
    the example inputs (name, shape) `inputs`."""
    result = export(tmp_path, zip_directory(directory, tmp_path / "ckpt.zip"), options or CHECKED)
    assert result.succeeded, result.report.error
    report = result.report
    assert report.checkpoint is not None
    assert (report.checkpoint.task, report.checkpoint.model_class) == built
    assert [(i.name, i.shape) for i in report.inputs] == inputs
    return result


def _program_matches_eager(tmp_path: Path, directory: Path, auto_class: str, **inputs: Any) -> None:
    """The program at other sizes than the example's gives the eager model's outputs."""
    program = torch.export.load(tmp_path / "out" / "program.pt2").module()
    model = getattr(transformers, auto_class).from_pretrained(directory).eval()
    with torch.no_grad():
        expected = model(**inputs)
    got = program(**inputs)
    for name, value in got.items():
        torch.testing.assert_close(value, expected[name], atol=1e-4, rtol=1e-4)


# --- a checkpoint with its own code ----------------------------------------------------

MODELING = """
import torch
from transformers import PretrainedConfig, PreTrainedModel


class ScalerConfig(PretrainedConfig):
    model_type = "tiny-scaler"

    def __init__(self, hidden_size=8, **kwargs):
        self.hidden_size = hidden_size
        super().__init__(**kwargs)


class ScalerModel(PreTrainedModel):
    config_class = ScalerConfig

    def __init__(self, config):
        super().__init__(config)
        self.embed = torch.nn.Embedding(config.vocab_size, config.hidden_size)
        self.proj = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        hidden = self.proj(self.embed(input_ids))
        if attention_mask is not None:
            hidden = hidden * attention_mask.unsqueeze(-1)
        return (hidden.tanh(),)
"""


def test_a_checkpoint_with_its_own_code_is_built_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "code" / "modeling_scaler.py"
    source.parent.mkdir()
    source.write_text(MODELING)
    spec = importlib.util.spec_from_file_location("modeling_scaler", source)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "modeling_scaler", module)  # save_pretrained copies it
    spec.loader.exec_module(module)
    module.ScalerConfig.register_for_auto_class()
    module.ScalerModel.register_for_auto_class("AutoModel")
    torch.manual_seed(0)
    config = module.ScalerConfig(vocab_size=32, max_position_embeddings=64)
    directory = tmp_path / "scaler"
    module.ScalerModel(config).save_pretrained(directory)
    assert (directory / "modeling_scaler.py").is_file()

    options = {"decomposition": {"mode": "none"}, "verify": {"samples": 1}}
    text = [("input_ids", [2, 16]), ("attention_mask", [2, 16])]
    built = ("feature-extraction", "ScalerModel")
    report = _exported(tmp_path, directory, built, text, options).report
    assert report.checkpoint.task_source == "auto_map"
    assert report.checkpoint.remote_code is True
    assert report.checkpoint.model_type == "tiny-scaler"
    assert report.verification.verdict == "verified"
    assert report.verification.roundtrip.status == "passed"  # loads with torch alone


# --- speech ------------------------------------------------------------------------------


def test_whisper_without_a_cache_exports_its_plain_forward_with_static_frames(
    tmp_path: Path,
) -> None:
    """`generation.cache: false`: one forward of encoder and decoder (the generation-ready
    pair is tests/engine/test_seq2seq.py's)."""
    directory = _saved(
        tmp_path / "whisper",
        "WhisperForConditionalGeneration",
        "WhisperConfig",
        vocab_size=64,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        num_mel_bins=8,
        max_source_positions=16,
        max_target_positions=32,
        decoder_start_token_id=1,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    inputs = [
        ("input_features", [2, 8, 32]),  # num_mel_bins, 2 * max_source_positions
        ("decoder_input_ids", [2, 8]),
    ]
    built = ("automatic-speech-recognition", "WhisperForConditionalGeneration")
    plain = {**CHECKED, "generation": {"cache": False}}
    result = _exported(tmp_path, directory, built, inputs, plain)
    report = result.report
    assert dims(result) == {
        "input_features": {"0": BATCH},
        "decoder_input_ids": {
            "0": "batch_size",
            "1": {"name": "decoder_sequence_length", "min": 1, "max": 32},
        },
    }
    assert report.verification.verdict == "verified"


WAV2VEC2_CONV = {
    "conv_dim": (8,) * 7,
    "conv_kernel": (10, 3, 3, 3, 3, 2, 2),
    "conv_stride": (5, 2, 2, 2, 2, 2, 2),
}
"""The feature encoder of every wav2vec2 checkpoint (a frame per 320 samples), narrow."""


def test_wav2vec2_ctc_takes_raw_audio_of_any_length(tmp_path: Path) -> None:
    directory = _saved(
        tmp_path / "wav2vec2",
        "Wav2Vec2ForCTC",
        "Wav2Vec2Config",
        vocab_size=32,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        **WAV2VEC2_CONV,
    )
    built = ("automatic-speech-recognition", "Wav2Vec2ForCTC")
    result = _exported(tmp_path, directory, built, [("input_values", [2, 16000])])
    report = result.report
    assert dims(result) == {
        "input_values": {"0": BATCH, "1": {"name": "sequence_length", "min": 1600, "max": 480000}}
    }
    # no check failed; samples at the largest sizes are too large to draw and skipped
    assert report.verification.passed is True and report.verification.checked >= 2
    torch.manual_seed(1)
    audio = torch.randn(3, 8123)  # not a multiple of the encoder's stride
    _program_matches_eager(tmp_path, directory, "AutoModelForCTC", input_values=audio)


# --- vision ------------------------------------------------------------------------------


def test_yolos_object_detection_has_a_static_image_size(tmp_path: Path) -> None:
    directory = _saved(
        tmp_path / "yolos",
        "YolosForObjectDetection",
        "YolosConfig",
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=[32, 32],
        patch_size=8,
        num_detection_tokens=4,
        num_labels=3,
    )
    built = ("object-detection", "YolosForObjectDetection")
    result = _exported(tmp_path, directory, built, [("pixel_values", [2, 3, 32, 32])])
    report = result.report
    assert report.checkpoint.task_source == "architectures"
    assert dims(result) == {"pixel_values": {"0": BATCH}}  # a patch_size: position embeddings
    assert report.verification.verdict == "verified"
    # logits (3 labels and "no object"), pred_boxes, last_hidden_state; the dims named
    assert report.model.inputs[0]["shape"] == ["batch_size", 3, 32, 32]
    assert [o["shape"] for o in report.model.outputs] == [
        ["batch_size", 4, 4],
        ["batch_size", 4, 4],
        ["batch_size", 21, 32],
    ]


def test_segformer_semantic_segmentation_takes_any_image_size(tmp_path: Path) -> None:
    directory = _saved(
        tmp_path / "segformer",
        "SegformerForSemanticSegmentation",
        "SegformerConfig",
        num_encoder_blocks=2,
        depths=[1, 1],
        sr_ratios=[2, 1],
        hidden_sizes=[16, 32],
        patch_sizes=[7, 3],
        strides=[4, 2],
        num_attention_heads=[1, 2],
        mlp_ratios=[2, 2],
        decoder_hidden_size=32,
        num_labels=3,
        image_size=32,
    )
    built = ("semantic-segmentation", "SegformerForSemanticSegmentation")
    result = _exported(tmp_path, directory, built, [("pixel_values", [2, 3, 32, 32])])
    report = result.report
    assert dims(result) == {
        "pixel_values": {
            "0": BATCH,
            "2": {"name": "height", "min": 32, "max": 1024},
            "3": {"name": "width", "min": 32, "max": 1024},
        }
    }
    assert report.verification.passed is True and report.verification.checked >= 2
    torch.manual_seed(1)
    image = torch.randn(1, 3, 64, 96)
    _program_matches_eager(
        tmp_path, directory, "AutoModelForSemanticSegmentation", pixel_values=image
    )
