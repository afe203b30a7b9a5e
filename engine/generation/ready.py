"""A decoder-only transformers model made generation-ready: the static-cache wrapper,
its example inputs and dynamic shapes; and what the generation checks need, for it and
for an encoder-decoder model (`Generation`, `Encoder`; built in `seq2seq`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from engine.errors import InvalidRequest, ModelNotFound
from schemas import GenerationOptions
from schemas.options import DEFAULT_MAX_CACHE_LEN

__all__ = [
    "PROMPT_TOKENS",
    "Encoder",
    "Generation",
    "cache_len",
    "make_ready",
    "no_static_cache",
]

PROMPT_TOKENS = 16
"""Length of the example prompt (batch 1): the prefill the program is traced with."""
STAGE = "loading"


@dataclass
class Encoder:
    """The encoder program's source: its eager wrapper, example input and dims."""

    module: torch.nn.Module
    """`forward(<input_name>) → last_hidden_state` (the model's own encoder)."""
    input_name: str
    """`input_ids` (text) or `input_features` (speech)."""
    kwargs: dict[str, torch.Tensor]
    dynamic_shapes: dict[str, Any] | None
    """In the contract's JSON form; None when every dim is static (Whisper's frames)."""
    program: torch.export.ExportedProgram | None = None
    """The decomposed, verified encoder program, once the pipeline has made it."""
    traced: torch.export.ExportedProgram | None = None
    """The encoder program before `run_decompositions` (ExecuTorch lowers from it)."""
    names: dict[str, str] = field(default_factory=dict)
    """The user's dim names for the encoder program's symbols."""

    def hidden_states(self) -> torch.Tensor:
        """The eager encoder's output on the example input."""
        with torch.no_grad():
            out: torch.Tensor = self.module(**self.kwargs)
        return out


@dataclass
class Generation:
    """What checks a generation-ready program: the eager model and the example prompt."""

    model: torch.nn.Module
    """The transformers model inside the wrapper (eager, dynamic cache when run alone)."""
    prompt: torch.Tensor
    """The tokens the program's generation starts from: the example prompt of a
    decoder-only model, the decoder start token of an encoder-decoder one."""
    max_new_tokens: int
    max_cache_len: int
    expected: list[int] | None = None
    """Eager transformers' tokens, once computed (`checks.expected_tokens`)."""
    encoder: Encoder | None = None
    """An encoder-decoder model's encoder program (`seq2seq`); the job's program is then
    its decoder, which takes `encoder_hidden_states`."""

    def runner_metadata(self) -> dict[str, Any]:
        """The constant methods ExecuTorch's LLM runner reads from a `.pte`, as
        `export_llama` and optimum-executorch write them."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if config is not None else None
        return {
            "get_max_seq_len": self.max_cache_len,
            "get_max_context_len": self.max_cache_len,
            "get_n_layers": int(getattr(text, "num_hidden_layers", 0) or 0),
            "get_vocab_size": int(getattr(text, "vocab_size", 0) or 0),
            "use_kv_cache": True,
            "use_sdpa_with_kv_cache": False,
            "enable_dynamic_shape": True,
        }


def _max_positions(config: Any) -> int | None:
    # a decoder's own context first (Whisper: max_target_positions, its encoder's differs)
    for name in ("max_target_positions", "max_position_embeddings", "n_positions", "max_seq_len"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def cache_len(config: Any, options: GenerationOptions, prompt_tokens: int = PROMPT_TOKENS) -> int:
    """The static cache's length: `generation.max_cache_len`, else the default bounded
    by the model's context; it must hold `prompt_tokens` and the generated tokens.

    Raises:
        ExportError: `invalid_request` (`cache_too_long`, `cache_too_short`).
    """
    limit = _max_positions(config)
    wanted = options.max_cache_len
    needed = prompt_tokens + options.max_new_tokens
    if wanted is None:
        wanted = DEFAULT_MAX_CACHE_LEN if limit is None else min(limit, DEFAULT_MAX_CACHE_LEN)
    elif limit is not None and wanted > limit:
        raise InvalidRequest(
            f"generation.max_cache_len {wanted} is over the model's context ({limit} positions).",
            hint=f"Set generation.max_cache_len to at most {limit}, or leave it unset.",
            stage=STAGE,
            details={"reason": "cache_too_long", "max_cache_len": wanted, "limit": limit},
        )
    if wanted < needed:
        raise InvalidRequest(
            f"A cache of {wanted} tokens cannot hold the {prompt_tokens}-token example prompt "
            f"and {options.max_new_tokens} generated tokens.",
            hint=f"Set generation.max_cache_len to at least {needed}, or lower "
            "generation.max_new_tokens.",
            stage=STAGE,
            details={"reason": "cache_too_short", "max_cache_len": wanted, "needed": needed},
        )
    return wanted


def no_static_cache(config: Any, exc: BaseException) -> ModelNotFound:
    """`model_not_found` (`no_static_cache`): transformers' recipe refused the model."""
    return ModelNotFound(
        f"transformers cannot give a {config.model_type} model a static KV cache: "
        f"{type(exc).__name__}: {exc}",
        hint="Set generation.cache to false to export the plain forward (no cache).",
        stage=STAGE,
        details={"reason": "no_static_cache", "exception": type(exc).__name__},
    )


def make_ready(
    model: torch.nn.Module, config: Any, options: GenerationOptions
) -> tuple[torch.nn.Module, Generation, dict[str, torch.Tensor], dict[str, Any]]:
    """Wrap `model` with a static cache; return the wrapper, the check's facts, the
    example inputs (`input_ids`, `cache_position`) and their dynamic shapes (JSON form).

    Raises:
        ExportError: `invalid_request` (a cache length the model cannot take),
            `model_not_found` (transformers cannot give this model a static cache).
    """
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM

    max_cache_len = cache_len(config, options)
    generation_config = getattr(model, "generation_config", None)
    saved = None
    if generation_config is not None:
        saved = (generation_config.cache_implementation, generation_config.use_cache)
        generation_config.cache_implementation = "static"
        generation_config.use_cache = True
    config.use_cache = True
    try:
        recipe = TorchExportableModuleForDecoderOnlyLM(
            model,  # type: ignore[arg-type]  # a PreTrainedModel, built by transformers
            batch_size=1,
            max_cache_len=max_cache_len,
            device=torch.device("cpu"),
        )
    except Exception as exc:
        raise no_static_cache(config, exc) from exc
    finally:
        if generation_config is not None and saved is not None:
            generation_config.cache_implementation, generation_config.use_cache = saved
    wrapper: torch.nn.Module = recipe.model
    vocab = getattr(config, "vocab_size", None) or 2
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, PROMPT_TOKENS), generator=generator)
    kwargs = {"input_ids": prompt, "cache_position": torch.arange(PROMPT_TOKENS)}
    sequence = {"name": "sequence_length", "min": 1, "max": max_cache_len}
    shapes = {"input_ids": {"1": sequence}, "cache_position": {"0": "sequence_length"}}
    generation = Generation(
        model=model,
        prompt=prompt,
        max_new_tokens=options.max_new_tokens,
        max_cache_len=max_cache_len,
    )
    return wrapper.eval(), generation, kwargs, shapes
