"""The ExecuTorch form of a generation-ready LLM: attention through ExecuTorch's own LLM
ops, over the filled part of the cache only.

transformers' static-cache recipe writes each step's keys and values with `index_copy_`
and attends over the whole cache under a mask: a decode step at position 64 of a 1024-token
cache reads and multiplies all 1024 positions of every layer. ExecuTorch's LLM custom ops
(`executorch.extension.llm.custom_ops`, the ops `export_llm` and optimum-executorch lower
with) do neither: `llama::update_cache` writes the new positions in place and
`llama::custom_sdpa` attends causally over positions `0 … start + n - 1` only, with
grouped-query heads as they are (no repeated keys). Both read the cache as `[batch,
position, heads, head_dim]`.

`form` makes that form from the job's eager wrapper: a copy that shares its weights, whose
cache layers hold `[batch, position, heads, head_dim]` buffers written by
`llama::update_cache`, whose attention is `llama::custom_sdpa` (a transformers attention
function registered under `ATTENTION`, with no mask: the op is causal itself), and whose
`forward` reads the start position once (`cache_position[0]`) for every layer. The
program keeps the wrapper's inputs (`input_ids`, `cache_position`), outputs and metadata,
so the runner and the checks see no difference; the `.pte` is verified against the eager
model as the other form is. A model the ops do not fit keeps the recipe's form, and the
report says why (`unsuited`): sliding-window, chunked or soft-capped attention, attention
sinks, a cache other than transformers' plain static one, a model computing in a reduced
precision (the op computes in float32), or a program whose attention did not all go
through the op.
"""

from __future__ import annotations

import importlib
from typing import Any, cast

import torch

from engine.generation import attention_forms
from engine.generation.ready import subclass
from engine.load import module_copies

__all__ = ["ATTENTION", "export", "form", "load_kernels", "lowered_attention", "unsuited"]

ATTENTION = "torchport_executorch_sdpa"
"""The transformers attention (and mask) function name of the form."""
CUSTOM_OPS = "executorch.extension.llm.custom_ops.custom_ops"
"""The module that registers the ops (and loads their kernels into the runtime)."""
SDPA = "llama.custom_sdpa"
"""What `lowered_attention` counts in a program."""


class _Position:
    """The start position of the current call, shared by a form's layers and attention."""

    start: Any = 0


def _sdpa(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention interface over `llama::custom_sdpa`, on the module's cache
    layer's buffers themselves: `key` and `value` are views of them (`_update`), and
    transposing those back would lower to a copy of the whole cache at every call."""
    layer: Any = module.torchport_layer
    start = layer.torchport_position.start
    out = torch.ops.llama.custom_sdpa(
        query.transpose(1, 2), layer.keys, layer.values, start, None, 0.0, True, scaling
    )
    return out, None


def _update(
    layer: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """`StaticLayer.update` of the form: the layer's buffers are `[batch, position, heads,
    head_dim]`, written by `llama::update_cache` at the call's start position; returned as
    `[batch, heads, position, head_dim]` views, as transformers' layers give them."""
    start = layer.torchport_position.start
    torch.ops.llama.update_cache(key_states.transpose(1, 2), layer.keys, start)
    torch.ops.llama.update_cache(value_states.transpose(1, 2), layer.values, start)
    return layer.keys.transpose(1, 2), layer.values.transpose(1, 2)


class _StartsOnce(torch.nn.Module):
    """The wrapper of the form: reads `cache_position[0]` once, bounded for the ops.

    The position is gathered from `torchport_positions` (`0 … max_cache_len - 1`) before
    it is read: ExecuTorch removes the program's checks when it lowers, and ExecuTorch
    1.4.1's `update_cache` refuses a start past the cache but writes a negative one before
    its buffer; its `gather` refuses both (error `0x12`)."""

    torchport_max_cache_len: int
    torchport_position: _Position
    torchport_positions: torch.Tensor

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        cache_position: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert cache_position is not None, "the static cache needs cache_position"
        start = torch.gather(self.torchport_positions, 0, cache_position[:1]).item()
        new = (input_ids if input_ids is not None else inputs_embeds).shape[1]  # type: ignore[union-attr]
        torch._check(start >= 0)
        torch._check(start + new <= self.torchport_max_cache_len)
        self.torchport_position.start = start
        out: torch.Tensor = super().forward(
            input_ids=input_ids, inputs_embeds=inputs_embeds, cache_position=cache_position
        )
        return out


def load_kernels() -> bool:
    """Register the ops and load their kernels into the ExecuTorch runtime of this
    process (a `.pte` of the form needs them); whether they are there."""
    try:
        importlib.import_module(CUSTOM_OPS)
    except (ImportError, OSError):
        return False
    return hasattr(torch.ops.llama, "custom_sdpa") and hasattr(torch.ops.llama, "update_cache")


def unsuited(wrapper: torch.nn.Module, float32: bool) -> str | None:
    """Why `wrapper` (a bounded decoder-only static-cache wrapper, `ready.bound_cache`)
    keeps the recipe's attention in ExecuTorch, or None when the ops fit it. `float32`:
    the program ExecuTorch lowers computes in float32 (the model does, or is widened)."""
    from transformers.cache_utils import StaticLayer

    cache = getattr(wrapper, "static_cache", None)
    size = getattr(wrapper, "torchport_max_cache_len", None)
    layers = getattr(cache, "layers", None)
    model = getattr(wrapper, "model", None)
    if not layers or model is None or size is None:
        return "the wrapper has no plain static cache"
    if any(type(layer) is not StaticLayer or layer.max_cache_len != size for layer in layers):
        return "its cache layers are not all transformers' plain static layers"
    why = attention_forms.unplain(model, window_below=size)
    if why is not None:
        return why
    modules = len(attention_forms.attention_modules(model))
    if modules != len(layers):
        return f"{modules} attention modules for {len(layers)} cache layers"
    if not float32:
        return "the model computes in a reduced precision; ExecuTorch's custom SDPA, in float32"
    if not load_kernels():
        return "ExecuTorch's LLM custom ops are not installed"
    return None


def form(wrapper: torch.nn.Module) -> torch.nn.Module:
    """A copy of `wrapper` (sharing its weights) in the ops' form; `unsuited` is None."""
    assert load_kernels(), "ExecuTorch's LLM custom ops are not installed"
    attention_forms.register(ATTENTION, _sdpa)
    copy = module_copies.sharing_weights(wrapper)
    position = _Position()
    copy.__class__ = subclass(type(copy), _StartsOnce, prefix="ExecuTorch", module=__name__)
    copy.torchport_position = position  # type: ignore[assignment]
    size = cast(int, copy.torchport_max_cache_len)
    copy.register_buffer("torchport_positions", torch.arange(size), persistent=False)
    cache: Any = copy.static_cache
    for index, layer in enumerate(cache.layers):
        batch, heads, length, _ = layer.keys.shape
        for attribute, prefix in (("keys", "key_cache_"), ("values", "value_cache_")):
            old = getattr(layer, attribute)
            buffer = torch.zeros(batch, length, heads, old.shape[-1], dtype=old.dtype)
            setattr(layer, attribute, buffer)
            copy._buffers[f"{prefix}{index}"] = buffer
        layer.__class__ = subclass(
            type(layer), prefix="ExecuTorch", module=__name__, update=_update
        )
        layer.torchport_position = position
    model: Any = copy.model
    for module in attention_forms.attention_modules(model):
        module.torchport_layer = cache.layers[module.layer_idx]
        module.config._attn_implementation = ATTENTION
    model.config._attn_implementation = ATTENTION
    return copy


def export(
    module: torch.nn.Module, kwargs: dict[str, Any], max_cache_len: int
) -> torch.export.ExportedProgram:
    """`module` (a `form`) exported non-strict on the example, the sequence dynamic."""
    sequence = torch.export.Dim("sequence_length", min=1, max=max_cache_len)
    return torch.export.export(
        module,
        (),
        dict(kwargs),
        dynamic_shapes={"input_ids": {1: sequence}, "cache_position": {0: sequence}},
        strict=False,
    )


def lowered_attention(program: torch.export.ExportedProgram) -> int:
    """How many `llama::custom_sdpa` calls `program` makes."""
    return attention_forms.calls(program, SDPA)
