"""An encoder-decoder transformers model made generation-ready: two programs.

As optimum-executorch exports T5 and Whisper, the model becomes an **encoder**
(`input_ids`, or Whisper's `input_features` → `last_hidden_state`) and a **decoder with
a static self-attention cache** (`decoder_input_ids`, `encoder_hidden_states`,
`cache_position` → `logits`), through transformers' own recipe
(`Seq2SeqLMDecoderExportableModuleWithStaticCache`). The decoder is the job's main
program (`program.pt2`), one method for the decoder's prefill and each decode step, as a
decoder-only LLM's; the encoder is a second program (`encoder.pt2`), run once per input.
Cross-attention is recomputed from `encoder_hidden_states` at every decoder call: the
decoder keeps no state of the encoder's, so one encoder output serves any number of
calls and a new input needs no reset.
"""

from __future__ import annotations

from typing import Any

import torch

from engine.generation.ready import (
    PROMPT_TOKENS,
    SECOND_PROMPT_TOKENS,
    Encoder,
    Generation,
    Prompt,
    bound_cache,
    cache_len,
    no_static_cache,
)
from schemas import GenerationOptions

__all__ = [
    "DECODER_EXAMPLE_TOKENS",
    "DECODER_INPUTS",
    "Encoder",
    "decoder_start",
    "eager_seq2seq_tokens",
    "make_seq2seq_ready",
    "second_source",
]

DECODER_EXAMPLE_TOKENS = 4
"""Decoder tokens of the example the decoder program is traced and verified with: the
start token and three more, a prefill at positions 0…3."""
DECODER_INPUTS = ["decoder_input_ids", "encoder_hidden_states", "cache_position"]


class TextEncoder(torch.nn.Module):
    """The model's encoder on token ids, returning its last hidden state."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.encoder(input_ids=input_ids).last_hidden_state
        return out


class SpeechEncoder(torch.nn.Module):
    """The model's encoder on log-mel features (Whisper), returning its last hidden state."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_features: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.encoder(input_features=input_features).last_hidden_state
        return out


def decoder_start(model: torch.nn.Module) -> int:
    """The token a decoder starts from: the generation config's, else the config's."""
    for source in (getattr(model, "generation_config", None), getattr(model, "config", None)):
        value = getattr(source, "decoder_start_token_id", None)
        if isinstance(value, int):
            return value
    return 0


def make_encoder(
    model: torch.nn.Module, config: Any, prompt: torch.Tensor, max_sequence: int
) -> Encoder:
    """The encoder program's source for `model`: text (`input_ids`, dynamic
    `encoder_sequence_length` 1…`max_sequence`) or speech (`input_features`, static:
    Whisper pads every input to its 30 s window)."""
    encoder = model.get_encoder()  # type: ignore[operator]
    if _is_speech(model):
        bins = int(getattr(config, "num_mel_bins", None) or 80)
        frames = 2 * int(getattr(config, "max_source_positions", None) or 1500)
        generator = torch.Generator().manual_seed(0)
        features = torch.randn(1, bins, frames, generator=generator)
        return Encoder(SpeechEncoder(encoder), "input_features", {"input_features": features}, None)
    length = {"name": "encoder_sequence_length", "min": 1, "max": max_sequence}
    return Encoder(
        TextEncoder(encoder),
        "input_ids",
        {"input_ids": prompt},
        {"input_ids": {"1": length}},
    )


def make_decoder(model: torch.nn.Module, config: Any, max_cache_len: int) -> torch.nn.Module:
    """transformers' static-cache decoder wrapper for `model` (its `lm_head`, or
    Whisper's `proj_out`, as the head).

    Raises:
        ExportError: `model_not_found` (`no_static_cache`) when transformers cannot.
    """
    from transformers.integrations.executorch import (
        Seq2SeqLMDecoderExportableModuleWithStaticCache,
    )

    head = model.get_output_embeddings()  # type: ignore[operator]
    added = not hasattr(model, "lm_head")
    if added:  # the recipe reads `model.lm_head`; Whisper calls it `proj_out`
        model.lm_head = head
    try:
        wrapper = Seq2SeqLMDecoderExportableModuleWithStaticCache(
            model, max_static_cache_length=max_cache_len, batch_size=1
        )
    except Exception as exc:
        raise no_static_cache(config, exc) from exc
    finally:
        if added:
            del model.lm_head
    return bound_cache(wrapper, max_cache_len).eval()


def second_source(
    encoder: Encoder, vocab: int, generator: torch.Generator
) -> dict[str, torch.Tensor]:
    """The encoder input of the check's second prompt: `SECOND_PROMPT_TOKENS` other token
    ids (text), or other features of the example's shape (speech: a fixed window)."""
    if encoder.input_name == "input_ids":
        return {
            "input_ids": torch.randint(0, vocab, (1, SECOND_PROMPT_TOKENS), generator=generator)
        }
    example = encoder.kwargs[encoder.input_name]
    return {encoder.input_name: torch.randn(example.shape, generator=generator)}


def _is_speech(model: torch.nn.Module) -> bool:
    import inspect

    try:
        parameters = inspect.signature(model.get_encoder().forward).parameters  # type: ignore[operator]
    except (TypeError, ValueError):
        return False
    return "input_features" in parameters


@torch.no_grad()
def eager_seq2seq_tokens(
    model: torch.nn.Module, encoder_kwargs: dict[str, torch.Tensor], start: int, count: int
) -> list[int]:
    """Greedy tokens of the transformers model itself: its encoder once, then its own
    forward with its dynamic cache, one token at a time from `start`."""
    encoded = model.get_encoder()(**encoder_kwargs)  # type: ignore[operator]
    token = torch.tensor([[start]])
    past = None
    tokens: list[int] = []
    for _ in range(count):
        out = model(
            encoder_outputs=encoded, decoder_input_ids=token, past_key_values=past, use_cache=True
        )
        past = out.past_key_values
        token = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        tokens.append(int(token))
    return tokens


def make_seq2seq_ready(
    model: torch.nn.Module, config: Any, options: GenerationOptions, max_sequence: int
) -> tuple[torch.nn.Module, Generation, dict[str, torch.Tensor], dict[str, Any]]:
    """The decoder with a static cache (the job's program), the facts of the checks with
    the encoder program's source, the decoder's example inputs and their dynamic shapes
    (JSON form). `max_sequence` bounds a text encoder's `encoder_sequence_length`.

    Raises:
        ExportError: `invalid_request` (a cache length the decoder cannot take),
            `model_not_found` (transformers cannot give it a static cache).
    """
    config.use_cache = True
    max_cache_len = cache_len(config, options, prompt_tokens=DECODER_EXAMPLE_TOKENS)
    vocab = int(getattr(config, "vocab_size", None) or 2)
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(0, vocab, (1, PROMPT_TOKENS), generator=generator)
    encoder = make_encoder(model, config, source, max_sequence)
    decoder = make_decoder(model, config, max_cache_len)
    start = decoder_start(model)
    more = torch.randint(0, vocab, (1, DECODER_EXAMPLE_TOKENS - 1), generator=generator)
    other = second_source(encoder, vocab, generator)
    kwargs = {
        "decoder_input_ids": torch.cat([torch.tensor([[start]]), more], dim=1),
        "encoder_hidden_states": encoder.hidden_states(),
        "cache_position": torch.arange(DECODER_EXAMPLE_TOKENS),
    }
    sequence = {"name": "sequence_length", "min": 1, "max": max_cache_len}
    shapes: dict[str, Any] = {
        "decoder_input_ids": {"1": sequence},
        "cache_position": {"0": "sequence_length"},
    }
    if encoder.dynamic_shapes is not None:
        length = {"name": "encoder_sequence_length", "min": 1, "max": max_sequence}
        shapes["encoder_hidden_states"] = {"1": length}
    generation = Generation(
        model=model,
        prompt=torch.tensor([[start]]),
        max_new_tokens=options.max_new_tokens,
        max_cache_len=max_cache_len,
        encoder=encoder,
        second=Prompt("second", torch.tensor([[start]]), other),
    )
    return decoder, generation, kwargs, shapes
