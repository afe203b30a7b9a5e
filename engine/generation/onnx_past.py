"""The ONNX form of a generation-ready LLM: the cache as explicit inputs and outputs.

ONNX has no mutable state, so the `onnx` target of a generation-ready export is its own
program, traced here from the transformers model: inputs `input_ids`,
`attention_mask`, `position_ids` and `past_key_values.{i}.key|value`, outputs `logits`
and `present.{i}.key|value`, as optimum names them (`text-generation-with-past`; its
`ORTModelForCausalLM` calls a model without `position_ids` legacy) and in the order
onnxruntime-genai's model builder writes them. Dims: `batch_size`, `sequence_length`
(`input_ids` and `position_ids`), `past_sequence_length` (0 at the prefill: empty past
tensors) and `total_sequence_length` (the mask: past and new tokens). `position_ids` are
the new tokens' positions (`past_sequence_length + 0…sequence_length-1` without padding,
as optimum derives them from the mask); the model's rotary or learned position
embeddings read them. A model whose forward takes no `position_ids` (ALiBi models) has
no such input. The present tensors are the past ones with the new tokens appended, fed
back as the next past.

An encoder-decoder model's decoder (`DecoderWithPast`) is traced the same way with its
self-attention cache: inputs `input_ids`, `encoder_hidden_states` and
`past_key_values.{i}.decoder.key|value`, outputs `logits` and
`present.{i}.decoder.key|value`; dims `batch_size`, `decoder_sequence_length`,
`encoder_sequence_length` (text) and `past_decoder_sequence_length`, as optimum names its
seq2seq decoders. Cross-attention is recomputed from `encoder_hidden_states` at every
call, so the encoder's keys and values are no inputs of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.generation.greedy import parted
from engine.generation.ready import Encoder, Generation, Prompt

__all__ = [
    "CacheReady",
    "DecoderWithPast",
    "Form",
    "PastProgram",
    "WithPast",
    "WithPastNoPositions",
    "past_program",
    "past_tokens",
    "takes_positions",
]

EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW = 2, 8, 4
MAX_BATCH = 64

FlatRunner = Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]]


CacheReady = Callable[[Any, torch.Tensor], None]
"""What readies a call's cache for a form's attention (`Form`), given the call's
`attention_mask`."""
Form = Callable[[torch.nn.Module], tuple[torch.nn.Module, CacheReady]]
"""A target's own form of the model (e.g. `engine.targets.onnx.attention.form`): a copy
of it and what readies each call's cache for it."""


class _Past(torch.nn.Module):
    """A transformers `model` whose cache goes in and out as plain tensors."""

    def __init__(self, model: torch.nn.Module, ready: CacheReady | None = None) -> None:
        super().__init__()
        self.model = model
        self.ready = ready

    def _cache(self, past_key_values: list[tuple[torch.Tensor, torch.Tensor]]) -> Any:
        """A `DynamicCache` holding `past_key_values`, layer by layer."""
        from transformers import DynamicCache

        config: Any = self.model.config
        cache = DynamicCache(config=config)
        for index, (key, value) in enumerate(past_key_values):
            cache.update(key, value, index)
        return cache


class WithPast(_Past):
    """`model` with the KV cache passed in and returned as plain tensors."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        return _with_past(self, input_ids, attention_mask, past_key_values, position_ids)


class WithPastNoPositions(_Past):
    """`WithPast` for a model whose forward takes no `position_ids`."""

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        return _with_past(self, input_ids, attention_mask, past_key_values)


def _with_past(
    wrapper: _Past,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    past_key_values: list[tuple[torch.Tensor, torch.Tensor]],
    position_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    extra = {} if position_ids is None else {"position_ids": position_ids}
    cache = wrapper._cache(past_key_values)
    if wrapper.ready is not None:
        wrapper.ready(cache, attention_mask)
    out = wrapper.model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        past_key_values=cache,
        use_cache=True,
        **extra,
    )
    present = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    return out.logits, present


def takes_positions(model: torch.nn.Module) -> bool:
    """Whether `model`'s forward takes `position_ids` (most decoders; not ALiBi ones)."""
    import inspect

    try:
        return "position_ids" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


class DecoderWithPast(_Past):
    """An encoder-decoder `model`'s decoder with its self-attention cache passed in and
    returned as plain tensors; cross-attention is recomputed from
    `encoder_hidden_states` at every call (the decoder keeps nothing of the encoder)."""

    def forward(
        self,
        input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        past_key_values: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        from transformers import EncoderDecoderCache
        from transformers.modeling_outputs import BaseModelOutput

        cache = EncoderDecoderCache(self._cache(past_key_values), self._cache([]))
        out = self.model(
            encoder_outputs=BaseModelOutput(last_hidden_state=encoder_hidden_states),
            decoder_input_ids=input_ids,
            past_key_values=cache,
            use_cache=True,
        )
        cache = out.past_key_values.self_attention_cache
        return out.logits, [(layer.keys, layer.values) for layer in cache.layers]


@dataclass
class PastProgram:
    """The traced program and the ONNX names of its inputs, outputs and dims. The program
    is not decomposed: the ONNX exporter decomposes it with its own table, as
    `torch.onnx.export(module)` does (its linears stay `MatMul`s)."""

    program: torch.export.ExportedProgram
    kwargs: dict[str, Any]
    """The example the model is verified on: the traced one, or its first row for a form
    whose attention takes new tokens after a past in batches of one only (ONNX Runtime's
    GroupQueryAttention)."""
    input_names: list[str]
    output_names: list[str]
    dim_names: dict[str, str]
    layers: int
    past_shape: tuple[int, int]
    """(heads, head_dim) of one past tensor: its dims 1 and 3."""
    past_dtype: torch.dtype
    task: str = "text-generation-with-past"
    """The ONNX model's `torchport.task` metadata, as optimum names the task."""
    positions: bool = False
    """Whether the model has a `position_ids` input (after `attention_mask`)."""


@torch.no_grad()
def past_program(generation: Generation, form: Form | None = None) -> PastProgram:
    """Trace the transformers model (a decoder-only one: in `form` when given) with its
    cache as inputs and outputs.

    The example past comes from the model itself (a prefill of `EXAMPLE_PAST` tokens),
    so its number of layers, heads and head size are the model's.
    """
    if generation.encoder is not None:
        return _decoder_past_program(generation, generation.encoder)
    model = generation.model
    vocab = getattr(model.config, "vocab_size", None) or int(generation.prompt.max()) + 1
    ids = torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_PAST))
    prefill = model(input_ids=ids, use_cache=True)
    past = [(layer.keys.clone(), layer.values.clone()) for layer in prefill.past_key_values.layers]
    layers = len(past)
    positions = takes_positions(model)
    kwargs: dict[str, Any] = {
        "input_ids": ids[:, :EXAMPLE_NEW].clone(),
        "attention_mask": torch.ones(EXAMPLE_BATCH, EXAMPLE_PAST + EXAMPLE_NEW, dtype=torch.long),
    }
    if positions:
        kwargs["position_ids"] = _positions(EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW)
    kwargs["past_key_values"] = past
    limit = generation.max_cache_len
    batch = torch.export.Dim("batch_size", min=1, max=MAX_BATCH)
    sequence = torch.export.Dim("sequence_length", min=1, max=limit)
    past_length = torch.export.Dim("past_sequence_length", min=0, max=limit)
    # The mask's length is the past's plus the new tokens'; torch cannot declare a sum of
    # two dims, and the model does not tie them: its own symbol, named below.
    shapes: dict[str, Any] = {
        "input_ids": {0: batch, 1: sequence},
        "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},
    }
    if positions:
        shapes["position_ids"] = {0: batch, 1: sequence}
    shapes["past_key_values"] = [({0: batch, 2: past_length}, {0: batch, 2: past_length})] * layers
    traced, ready = (model, None) if form is None else form(model)
    wrapper = (WithPast if positions else WithPastNoPositions)(traced, ready)
    program = torch.export.export(wrapper, (), kwargs, dynamic_shapes=shapes, strict=False)
    inputs = ["input_ids", "attention_mask"] + (["position_ids"] if positions else [])
    inputs += [f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")]
    outputs = ["logits"] + [
        f"present.{i}.{part}" for i in range(layers) for part in ("key", "value")
    ]
    names = _dim_names(program, first_past=3 if positions else 2)
    key = past[0][0]
    if form is not None:
        kwargs = pytree.tree_map(lambda leaf: leaf[:1].clone(), kwargs)
    return PastProgram(
        program,
        kwargs,
        inputs,
        outputs,
        names,
        layers,
        (key.shape[1], key.shape[3]),
        key.dtype,
        positions=positions,
    )


def _positions(batch: int, past: int, new: int) -> torch.Tensor:
    """`position_ids` of `new` tokens after `past` ones, every row alike (no padding)."""
    return torch.arange(past, past + new, dtype=torch.long).repeat(batch, 1)


def _decoder_past_program(generation: Generation, encoder: Encoder) -> PastProgram:
    """An encoder-decoder model's decoder traced with its self-attention cache as inputs
    and outputs: inputs `input_ids`, `encoder_hidden_states`,
    `past_key_values.{i}.decoder.key|value`; outputs `logits`,
    `present.{i}.decoder.key|value` (optimum's names)."""
    model = generation.model
    vocab = getattr(model.config, "vocab_size", None) or int(generation.prompt.max()) + 1
    hidden = encoder.hidden_states().expand(EXAMPLE_BATCH, -1, -1).contiguous()
    ids = torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_PAST))
    wrapper = DecoderWithPast(model)
    _, prefill = wrapper(ids, hidden, [])
    past = [(key.clone(), value.clone()) for key, value in prefill]
    layers = len(past)
    kwargs: dict[str, Any] = {
        "input_ids": ids[:, :EXAMPLE_NEW].clone(),
        "encoder_hidden_states": hidden,
        "past_key_values": past,
    }
    limit = generation.max_cache_len
    batch = torch.export.Dim("batch_size", min=1, max=MAX_BATCH)
    sequence = torch.export.Dim("decoder_sequence_length", min=1, max=limit)
    past_length = torch.export.Dim("past_decoder_sequence_length", min=0, max=limit)
    hidden_spec: dict[int, Any] = {0: batch}
    if encoder.dynamic_shapes is not None:
        bound = encoder.dynamic_shapes[encoder.input_name]["1"]["max"]
        hidden_spec[1] = torch.export.Dim("encoder_sequence_length", min=1, max=bound)
    shapes = {
        "input_ids": {0: batch, 1: sequence},
        "encoder_hidden_states": hidden_spec,
        "past_key_values": [({0: batch, 2: past_length}, {0: batch, 2: past_length})] * layers,
    }
    program = torch.export.export(wrapper, (), kwargs, dynamic_shapes=shapes, strict=False)
    parts = ("decoder.key", "decoder.value")
    inputs = ["input_ids", "encoder_hidden_states"] + [
        f"past_key_values.{i}.{part}" for i in range(layers) for part in parts
    ]
    outputs = ["logits"] + [f"present.{i}.{part}" for i in range(layers) for part in parts]
    names = {
        str(symbol): name
        for symbol, name in _symbols(
            program,
            [
                (0, 0, "batch_size"),
                (0, 1, "decoder_sequence_length"),
                (1, 1, "encoder_sequence_length"),
                (2, 2, "past_decoder_sequence_length"),
            ],
        )
    }
    key = past[0][0]
    task = (
        "automatic-speech-recognition"
        if encoder.input_name == "input_features"
        else "text2text-generation"
    )
    return PastProgram(
        program,
        kwargs,
        inputs,
        outputs,
        names,
        layers,
        (key.shape[1], key.shape[3]),
        key.dtype,
        task=f"{task}-with-past",
    )


def _symbols(
    program: torch.export.ExportedProgram, where: list[tuple[int, int, str]]
) -> list[tuple[str, str]]:
    """(symbol, name) for each (user input index, dim, name) whose size is symbolic."""
    values = [
        node.meta["val"]
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in _user_inputs(program)
    ]
    found = []
    for index, dim, name in where:
        size = values[index].shape[dim]
        if isinstance(size, torch.SymInt):
            found.append((str(size.node.expr), name))
    return found


def _dim_names(program: torch.export.ExportedProgram, first_past: int) -> dict[str, str]:
    values = [
        node.meta["val"]
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in _user_inputs(program)
    ]
    names: dict[str, str] = {}

    def name(size: Any, label: str) -> None:
        if isinstance(size, torch.SymInt):
            names.setdefault(str(size.node.expr), label)

    ids, mask, key = values[0], values[1], values[first_past]
    name(ids.shape[0], "batch_size")
    name(ids.shape[1], "sequence_length")
    name(key.shape[2], "past_sequence_length")
    name(mask.shape[1], "total_sequence_length")
    return names


def _user_inputs(program: torch.export.ExportedProgram) -> set[str]:
    kind = torch.export.graph_signature.InputKind.USER_INPUT
    return {
        spec.arg.name
        for spec in program.graph_signature.input_specs
        if spec.kind == kind and hasattr(spec.arg, "name")
    }


def past_tokens(
    flat: FlatRunner,
    made: PastProgram,
    generation: Generation,
    encoder_flat: FlatRunner | None = None,
    prompt: Prompt | None = None,
    expected: list[int] | None = None,
) -> list[int]:
    """Greedy tokens of the ONNX model from `prompt` (the example prompt when None): the
    prompt with an empty past, then one token at a time with the presents fed back as
    the past and the next `position_ids`. An encoder-decoder model's decoder starts from
    its start token, fed `encoder_flat`'s output on the prompt's encoder input (the ONNX
    encoder's). With `expected` (eager's tokens), up to the first that differs."""
    if prompt is None:
        prompt = generation.prompts()[0]
    batch = prompt.ids.shape[0]
    heads, head_dim = made.past_shape
    empty = torch.zeros(batch, heads, 0, head_dim, dtype=made.past_dtype)
    past = [(empty, empty) for _ in range(made.layers)]
    hidden = None
    if generation.encoder is not None:
        assert encoder_flat is not None, "an encoder-decoder model's ONNX needs its encoder"
        assert prompt.source is not None, "an encoder-decoder prompt has an encoder input"
        hidden = encoder_flat((), dict(prompt.source))[-1]
    ids = prompt.ids
    tokens: list[int] = []
    for _ in range(generation.max_new_tokens):
        if tokens and parted(tokens, expected):
            break
        if hidden is None:
            done = past[0][0].shape[2]
            mask = torch.ones(batch, done + ids.shape[1], dtype=torch.long)
            feed: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
            if made.positions:
                feed["position_ids"] = _positions(batch, done, ids.shape[1])
            feed["past_key_values"] = past
        else:
            feed = {"input_ids": ids, "encoder_hidden_states": hidden, "past_key_values": past}
        outputs = list(flat((), feed))
        logits, presents = outputs[0], outputs[1:]
        ids = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        tokens.append(int(ids))
        past = [(presents[2 * i], presents[2 * i + 1]) for i in range(made.layers)]
    return tokens
