"""A decoder-only transformers model made generation-ready: the static-cache wrapper,
its example inputs and dynamic shapes; and what the generation checks need, for it and
for an encoder-decoder model (`Generation`, `Encoder`, `Prompt`; built in `seq2seq`).

The wrapper refuses a `cache_position` outside the cache (`bound_cache`): transformers'
recipe writes the new keys and values at those positions, which past the cache is an
`IndexError` deep in the program, or error `0x12` of an `index_put` in ExecuTorch. The
check is an `aten._assert_async.msg` node of the program (no host synchronisation on an
accelerator), so `program.pt2` and `model.aoti.pt2` raise a `RuntimeError` with
`CACHE_BOUND_MESSAGE`; ExecuTorch removes assertion nodes when it lowers, so `model.pte`
keeps its runtime's own bounds check (`0x12`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import torch

from engine.errors import InvalidRequest, ModelNotFound
from schemas import GenerationOptions
from schemas.options import DEFAULT_MAX_CACHE_LEN

__all__ = [
    "CACHE_BOUND_MESSAGE",
    "PROMPT_TOKENS",
    "SECOND_PROMPT_TOKENS",
    "Encoder",
    "Generation",
    "Prompt",
    "bound_cache",
    "cache_len",
    "make_ready",
    "no_static_cache",
    "subclass",
]

PROMPT_TOKENS = 16
"""Length of the example prompt (batch 1): the prefill the program is traced with."""
SECOND_PROMPT_TOKENS = 7
"""Length of the check's second prompt: shorter than the example, so the cache still
holds the first run's keys and values beyond it when it starts again at position 0."""
CACHE_BOUND_MESSAGE = (
    "torchport: cache_position must lie in 0…{last}: the static KV cache holds "
    "max_cache_len = {size} tokens. Start a new sequence at position 0, or export with a "
    "larger generation.max_cache_len."
)
"""The program's error for a position outside the cache (`bound_cache`)."""
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


@dataclass(frozen=True)
class Prompt:
    """What one run of the generation check starts from."""

    name: str
    """`example` (the example prompt) or `second` (the second prompt)."""
    ids: torch.Tensor
    """The decoder's prompt [1, n]: a decoder-only model's prompt, an encoder-decoder
    model's decoder start token."""
    source: dict[str, torch.Tensor] | None = None
    """An encoder-decoder model's encoder input for this run (its encoder's kwargs)."""


@dataclass
class Generation:
    """What checks a generation-ready program: the eager model and the prompts."""

    model: torch.nn.Module
    """The transformers model inside the wrapper (eager, dynamic cache when run alone)."""
    prompt: torch.Tensor
    """The tokens the program's generation starts from: the example prompt of a
    decoder-only model, the decoder start token of an encoder-decoder one."""
    max_new_tokens: int
    max_cache_len: int
    encoder: Encoder | None = None
    """An encoder-decoder model's encoder program (`seq2seq`); the job's program is then
    its decoder, which takes `encoder_hidden_states`."""
    second: Prompt | None = None
    """The second prompt: `SECOND_PROMPT_TOKENS` other seeded tokens (an
    encoder-decoder model: the start token, with another encoder input)."""
    references: dict[str, list[int]] = field(default_factory=dict)
    """Eager transformers' tokens per prompt name, once computed (`checks.reference`)."""
    judged: dict[tuple[str, int, int | None], dict[str, Any]] = field(default_factory=dict)
    """Reduced-precision mismatches judged against the noise (`checks._noise`), by prompt
    name, index and the artifact's token there: each costs two eager runs."""

    def prompts(self) -> list[Prompt]:
        """The check's runs, in order on one loaded program or artifact: the example
        prompt, then the second prompt and the example again, each started again at
        position 0 over what the run before left in the cache."""
        source = None if self.encoder is None else self.encoder.kwargs
        example = Prompt("example", self.prompt, source)
        return [example] if self.second is None else [example, self.second, example]

    def token(self, name: str) -> int | list[int] | None:
        """A special token id (`eos_token_id`, `bos_token_id`, …): the model's generation
        config's, else its (text) config's."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if config is not None else None
        for source in (getattr(self.model, "generation_config", None), text):
            value = getattr(source, name, None)
            if isinstance(value, int) or (isinstance(value, list) and value):
                return value
        return None

    def eos_ids(self) -> list[int]:
        """The end-of-sequence token ids a generation loop stops at (none known: [])."""
        found = self.token("eos_token_id")
        return [found] if isinstance(found, int) else [int(each) for each in found or []]

    def runner_metadata(self) -> dict[str, Any]:
        """The constant methods ExecuTorch's LLM runner reads from a `.pte`, as
        `export_llama` and optimum-executorch write them (`get_bos_id`, `get_eos_ids`
        where the model's configs name them: the runner stops at those tokens)."""
        config = getattr(self.model, "config", None)
        text = config.get_text_config() if config is not None else None
        found: dict[str, Any] = {
            "get_max_seq_len": self.max_cache_len,
            "get_max_context_len": self.max_cache_len,
            "get_n_layers": int(getattr(text, "num_hidden_layers", 0) or 0),
            "get_vocab_size": int(getattr(text, "vocab_size", 0) or 0),
            "use_kv_cache": True,
            "use_sdpa_with_kv_cache": False,
            "enable_dynamic_shape": True,
        }
        bos = self.token("bos_token_id")
        if isinstance(bos, int):
            found["get_bos_id"] = bos
        eos = self.eos_ids()
        if eos:
            found["get_eos_ids"] = eos
        return found


class _BoundedLM(torch.nn.Module):
    """A decoder-only static-cache wrapper (transformers' `TorchExportableModuleWith…Cache`)
    that refuses positions outside its cache (`bound_cache`)."""

    torchport_max_cache_len: int

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert cache_position is not None, "the static cache needs cache_position"
        _assert_in_cache(cache_position, self.torchport_max_cache_len)
        _rebind_cache(self)
        out: torch.Tensor = super().forward(
            input_ids=input_ids, inputs_embeds=inputs_embeds, cache_position=cache_position
        )
        return out


class _BoundedDecoder(torch.nn.Module):
    """An encoder-decoder model's static-cache decoder wrapper that refuses positions
    outside its cache (`bound_cache`)."""

    torchport_max_cache_len: int

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        cache_position: torch.Tensor,
    ) -> torch.Tensor:
        _assert_in_cache(cache_position, self.torchport_max_cache_len)
        _rebind_cache(self)
        out: torch.Tensor = super().forward(
            decoder_input_ids, encoder_hidden_states, cache_position
        )
        return out


_CACHE_BUFFERS = (("keys", "key_cache_"), ("values", "value_cache_"))
_CACHE_STATE = (("cumulative_length", "cumulative_length_"),)


def _rebind_cache(wrapper: torch.nn.Module) -> None:
    """Point the cache's layers at the wrapper's own buffers before each call.

    transformers registers the cache's tensors as the wrapper's buffers
    (`key_cache_{i}`, …). Strict tracing follows the tensors themselves; non-strict
    tracing swaps the module's buffers for traced ones, and the cache would go on writing
    its original tensors, a mutation the program would not hold. Rebinding makes the
    cache write the buffers the trace sees (eagerly, the same tensors): so the program
    can be traced non-strict, which never touches the weights' values (strict tracing of
    a 1.24B Llama held 3.5 GB more and read every weight page)."""
    cache = getattr(wrapper, "static_cache", None) or getattr(wrapper, "cache", None)
    layers = getattr(cache, "layers", None)
    if layers is None:
        return
    buffers = wrapper._buffers
    for i, layer in enumerate(layers):
        for attribute, prefix in (*_CACHE_BUFFERS, *_CACHE_STATE):
            buffer = buffers.get(f"{prefix}{i}")
            if buffer is not None and hasattr(layer, attribute):
                setattr(layer, attribute, buffer)


def _assert_in_cache(cache_position: torch.Tensor, size: int) -> None:
    inside = ((cache_position >= 0) & (cache_position < size)).all()
    torch._assert_async(inside, CACHE_BOUND_MESSAGE.format(last=size - 1, size=size))


_SUBCLASSES: dict[tuple[str, type, type | None], type] = {}
"""The subclasses `subclass` made: one per (prefix, class, mixin)."""


def subclass(
    cls: type, mixin: type | None = None, *, prefix: str, module: str, **namespace: Any
) -> type:
    """A subclass of `cls` named `prefix` + its name, after `mixin` or with `namespace`,
    made once per (prefix, class, mixin) and defined in `module`: what a `__class__` swap
    gives an instance (its buffers and parameters keep their names). A cache layer takes
    no mixin: its instance layout would change."""
    key = (prefix, cls, mixin)
    if key not in _SUBCLASSES:
        bases = (cls,) if mixin is None else (mixin, cls)
        namespace = {"__module__": module, **namespace}
        _SUBCLASSES[key] = type(f"{prefix}{cls.__name__}", bases, namespace)
    return _SUBCLASSES[key]


def bound_cache(wrapper: torch.nn.Module, max_cache_len: int) -> torch.nn.Module:
    """`wrapper` (transformers' static-cache wrapper, decoder-only or an encoder-decoder
    model's decoder) made to check `0 <= cache_position < max_cache_len` before it
    writes the cache. Its class becomes a subclass of its own whose `forward` checks
    and calls the original: the buffers keep their names (`key_cache_{i}`, …).

    Its parameters stop requiring gradients: a program traced non-strict keeps the flag,
    and ExecuTorch's passes refuse to write the cache from values that carry one."""
    for parameter in wrapper.parameters():
        parameter.requires_grad_(False)
    decoder = "decoder_input_ids" in _parameters(type(wrapper).forward)
    mixin = _BoundedDecoder if decoder else _BoundedLM
    wrapper.__class__ = subclass(type(wrapper), mixin, prefix="Bounded", module=__name__)
    cast(_BoundedLM | _BoundedDecoder, wrapper).torchport_max_cache_len = max_cache_len
    return wrapper


def _parameters(function: Any) -> set[str]:
    import inspect

    return set(inspect.signature(function).parameters)


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
    wrapper = bound_cache(recipe.model, max_cache_len)
    vocab = getattr(config, "vocab_size", None) or 2
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, vocab, (1, PROMPT_TOKENS), generator=generator)
    second = torch.randint(0, vocab, (1, SECOND_PROMPT_TOKENS), generator=generator)
    kwargs = {"input_ids": prompt, "cache_position": torch.arange(PROMPT_TOKENS)}
    sequence = {"name": "sequence_length", "min": 1, "max": max_cache_len}
    shapes = {"input_ids": {"1": sequence}, "cache_position": {"0": "sequence_length"}}
    generation = Generation(
        model=model,
        prompt=prompt,
        max_new_tokens=options.max_new_tokens,
        max_cache_len=max_cache_len,
        second=Prompt("second", second),
    )
    return wrapper.eval(), generation, kwargs, shapes
