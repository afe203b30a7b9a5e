"""Example inputs and dynamic shapes for a task, like optimum's dummy input generators.

Text: `input_ids`, `attention_mask` (and `token_type_ids` where `forward` takes them),
batch 2 by sequence 16, dims `batch_size` and `sequence_length`; seq2seq models also get
`decoder_input_ids` (`decoder_sequence_length`). Vision: `pixel_values` at the config's
`image_size`, dims `height` and `width` where the model takes other sizes (not for
patch-embedding models, whose position embeddings fix the size). Speech:
`input_features` (Whisper-like: static frames) or `input_values` (CTC, raw audio).
The dynamic shapes are in the contract's JSON form (docs/contract.md §3).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "BATCH",
    "EXAMPLE_BATCH",
    "EXAMPLE_SEQUENCE",
    "MAX_BATCH",
    "MAX_SEQUENCE",
    "TaskInputs",
    "max_sequence",
    "task_inputs",
]

EXAMPLE_BATCH = 2
EXAMPLE_SEQUENCE = 16
MAX_BATCH = 64
"""Upper bound of `batch_size`: verification runs the model at every dim's maximum."""
MAX_SEQUENCE = 2048
"""Upper bound of `sequence_length` when the config's own maximum is larger or unknown."""
MIN_IMAGE, MAX_IMAGE = 32, 1024
AUDIO_SAMPLES = 16000
"""One second at 16 kHz: the example length of raw audio (`input_values`)."""

BATCH = {"name": "batch_size", "min": 1, "max": MAX_BATCH}

_VISION_TASKS = frozenset({"image-classification", "object-detection", "semantic-segmentation"})
_SPEECH_TASKS = frozenset({"automatic-speech-recognition"})
"""Every other task (schemas.TaskName) takes text."""


@dataclass(frozen=True)
class TaskInputs:
    """Keyword inputs of `forward` and their dynamic shapes (contract JSON)."""

    kwargs: dict[str, torch.Tensor]
    dynamic_shapes: dict[str, Any]


def _parameters(model: torch.nn.Module) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _config_value(config: Any, *names: str) -> Any:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def max_sequence(config: Any) -> int:
    """The upper bound of a text input's length: the config's context, at most 2048."""
    limit = _config_value(
        config, "max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length"
    )
    if isinstance(limit, int) and limit >= EXAMPLE_SEQUENCE:
        return min(limit, MAX_SEQUENCE)
    return MAX_SEQUENCE


def _vocab(config: Any) -> int:
    vocab = _config_value(config, "vocab_size")
    return vocab if isinstance(vocab, int) and vocab > 0 else 2


def task_inputs(task: str, model: torch.nn.Module, config: Any) -> TaskInputs:
    """The example inputs of `task` for `model` built from `config`, seeded."""
    generator = torch.Generator().manual_seed(0)
    parameters = _parameters(model)
    if task in _VISION_TASKS:
        return _vision(config, generator)
    if task in _SPEECH_TASKS:
        return _speech(config, parameters, generator)
    return _text(config, parameters, generator, seq2seq=task == "text2text-generation")


def _ids(config: Any, length: int, generator: torch.Generator) -> torch.Tensor:
    return torch.randint(0, _vocab(config), (EXAMPLE_BATCH, length), generator=generator)


def _text(
    config: Any, parameters: set[str], generator: torch.Generator, *, seq2seq: bool
) -> TaskInputs:
    sequence = {"name": "sequence_length", "min": 1, "max": max_sequence(config)}
    kwargs: dict[str, torch.Tensor] = {
        "input_ids": _ids(config, EXAMPLE_SEQUENCE, generator),
        "attention_mask": torch.ones(EXAMPLE_BATCH, EXAMPLE_SEQUENCE, dtype=torch.long),
    }
    shapes: dict[str, Any] = {
        "input_ids": {"0": BATCH, "1": sequence},
        "attention_mask": {"0": "batch_size", "1": "sequence_length"},
    }
    if "token_type_ids" in parameters and _config_value(config, "type_vocab_size"):
        kwargs["token_type_ids"] = torch.zeros(EXAMPLE_BATCH, EXAMPLE_SEQUENCE, dtype=torch.long)
        shapes["token_type_ids"] = {"0": "batch_size", "1": "sequence_length"}
    if seq2seq or "decoder_input_ids" in parameters:
        _add_decoder(config, kwargs, shapes, generator)
    return TaskInputs(kwargs, shapes)


def _add_decoder(
    config: Any,
    kwargs: dict[str, torch.Tensor],
    shapes: dict[str, Any],
    generator: torch.Generator,
) -> None:
    decoder_max = _config_value(config, "max_target_positions") or max_sequence(config)
    kwargs["decoder_input_ids"] = _ids(config, EXAMPLE_SEQUENCE // 2, generator)
    shapes["decoder_input_ids"] = {
        "0": "batch_size",
        "1": {"name": "decoder_sequence_length", "min": 1, "max": min(decoder_max, MAX_SEQUENCE)},
    }


def _image_size(config: Any) -> tuple[int, int]:
    size = _config_value(config, "image_size")
    if isinstance(size, int):
        return size, size
    if isinstance(size, list | tuple) and len(size) == 2:
        return int(size[0]), int(size[1])
    return 224, 224


def _vision(config: Any, generator: torch.Generator) -> TaskInputs:
    height, width = _image_size(config)
    channels = _config_value(config, "num_channels") or 3
    pixel_values = torch.randn(EXAMPLE_BATCH, channels, height, width, generator=generator)
    spec: dict[str, Any] = {"0": BATCH}
    # ViT-like models add position embeddings of a fixed number of patches: other sizes
    # fail (or need interpolate_pos_encoding), so height and width stay static there
    if _config_value(config, "patch_size") is None:
        spec["2"] = {"name": "height", "min": MIN_IMAGE, "max": max(MAX_IMAGE, height)}
        spec["3"] = {"name": "width", "min": MIN_IMAGE, "max": max(MAX_IMAGE, width)}
    return TaskInputs({"pixel_values": pixel_values}, {"pixel_values": spec})


def _speech(config: Any, parameters: set[str], generator: torch.Generator) -> TaskInputs:
    if "input_features" in parameters:
        bins = _config_value(config, "num_mel_bins", "feature_size") or 80
        frames = 2 * (_config_value(config, "max_source_positions") or 1500)
        kwargs = {"input_features": torch.randn(EXAMPLE_BATCH, bins, frames, generator=generator)}
        shapes: dict[str, Any] = {"input_features": {"0": BATCH}}
    else:
        kwargs = {"input_values": torch.randn(EXAMPLE_BATCH, AUDIO_SAMPLES, generator=generator)}
        shapes = {
            "input_values": {
                "0": BATCH,
                "1": {"name": "sequence_length", "min": 1600, "max": 30 * AUDIO_SAMPLES},
            }
        }
    if "decoder_input_ids" in parameters:
        _add_decoder(config, kwargs, shapes, generator)
    return TaskInputs(kwargs, shapes)
