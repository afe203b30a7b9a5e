"""The ONNX form of a generation-ready LLM: the cache as explicit inputs and outputs.

ONNX has no mutable state, so the `onnx` target of a generation-ready export is its own
program, traced here from the transformers model: inputs `input_ids`,
`attention_mask` and `past_key_values.{i}.key|value`, outputs `logits` and
`present.{i}.key|value`, as optimum names them (`text-generation-with-past`). Dims:
`batch_size`, `sequence_length`, `past_sequence_length` (0 at the prefill: empty past
tensors) and `total_sequence_length` (the mask: past and new tokens). The present
tensors are the past ones with the new tokens appended, fed back as the next past.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.generation.ready import Generation

__all__ = ["PastProgram", "WithPast", "past_program", "past_tokens"]

EXAMPLE_BATCH, EXAMPLE_PAST, EXAMPLE_NEW = 2, 8, 4
MAX_BATCH = 64

FlatRunner = Callable[[tuple[Any, ...], dict[str, Any]], Sequence[Any]]


class WithPast(torch.nn.Module):
    """`model` with the KV cache passed in and returned as plain tensors."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        past_key_values: list[tuple[torch.Tensor, torch.Tensor]],
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        from transformers import DynamicCache

        config: Any = self.model.config
        cache = DynamicCache(config=config)
        for index, (key, value) in enumerate(past_key_values):
            cache.update(key, value, index)
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            past_key_values=cache,
            use_cache=True,
        )
        present = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return out.logits, present


@dataclass
class PastProgram:
    """The traced program and the ONNX names of its inputs, outputs and dims."""

    program: torch.export.ExportedProgram
    kwargs: dict[str, Any]
    input_names: list[str]
    output_names: list[str]
    dim_names: dict[str, str]
    layers: int
    past_shape: tuple[int, int]
    """(heads, head_dim) of one past tensor: its dims 1 and 3."""
    past_dtype: torch.dtype


@torch.no_grad()
def past_program(generation: Generation) -> PastProgram:
    """Trace the transformers model with its cache as inputs and outputs.

    The example past comes from the model itself (a prefill of `EXAMPLE_PAST` tokens),
    so its number of layers, heads and head size are the model's.
    """
    model = generation.model
    vocab = getattr(model.config, "vocab_size", None) or int(generation.prompt.max()) + 1
    ids = torch.randint(0, vocab, (EXAMPLE_BATCH, EXAMPLE_PAST))
    prefill = model(input_ids=ids, use_cache=True)
    past = [(layer.keys.clone(), layer.values.clone()) for layer in prefill.past_key_values.layers]
    layers = len(past)
    kwargs: dict[str, Any] = {
        "input_ids": ids[:, :EXAMPLE_NEW].clone(),
        "attention_mask": torch.ones(EXAMPLE_BATCH, EXAMPLE_PAST + EXAMPLE_NEW, dtype=torch.long),
        "past_key_values": past,
    }
    limit = generation.max_cache_len
    batch = torch.export.Dim("batch_size", min=1, max=MAX_BATCH)
    sequence = torch.export.Dim("sequence_length", min=1, max=limit)
    past_length = torch.export.Dim("past_sequence_length", min=0, max=limit)
    # The mask's length is the past's plus the new tokens'; torch cannot declare a sum of
    # two dims, and the model does not tie them: its own symbol, named below.
    shapes = {
        "input_ids": {0: batch, 1: sequence},
        "attention_mask": {0: batch, 1: torch.export.Dim.AUTO},
        "past_key_values": [({0: batch, 2: past_length}, {0: batch, 2: past_length})] * layers,
    }
    program = torch.export.export(
        WithPast(model), (), kwargs, dynamic_shapes=shapes, strict=False
    ).run_decompositions()
    inputs = ["input_ids", "attention_mask"] + [
        f"past_key_values.{i}.{part}" for i in range(layers) for part in ("key", "value")
    ]
    outputs = ["logits"] + [
        f"present.{i}.{part}" for i in range(layers) for part in ("key", "value")
    ]
    names = _dim_names(program, layers)
    key = past[0][0]
    return PastProgram(
        program, kwargs, inputs, outputs, names, layers, (key.shape[1], key.shape[3]), key.dtype
    )


def _dim_names(program: torch.export.ExportedProgram, layers: int) -> dict[str, str]:
    values = [
        node.meta["val"]
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in _user_inputs(program)
    ]
    names: dict[str, str] = {}

    def name(size: Any, label: str) -> None:
        if isinstance(size, torch.SymInt):
            names.setdefault(str(size.node.expr), label)

    ids, mask, key = values[0], values[1], values[2]
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


def past_tokens(flat: FlatRunner, made: PastProgram, generation: Generation) -> list[int]:
    """Greedy tokens of the ONNX model: the prompt with an empty past, then one token at
    a time with the presents fed back as the past."""
    prompt = generation.prompt
    heads, head_dim = made.past_shape
    empty = torch.zeros(prompt.shape[0], heads, 0, head_dim, dtype=made.past_dtype)
    past = [(empty, empty) for _ in range(made.layers)]
    ids = prompt
    tokens: list[int] = []
    for _ in range(generation.max_new_tokens):
        length = past[0][0].shape[2] + ids.shape[1]
        mask = torch.ones(prompt.shape[0], length, dtype=torch.long)
        outputs = list(
            flat((), {"input_ids": ids, "attention_mask": mask, "past_key_values": past})
        )
        logits, presents = outputs[0], outputs[1:]
        ids = logits[:, -1, :].argmax(dim=-1, keepdim=True)
        tokens.append(int(ids))
        past = [(presents[2 * i], presents[2 * i + 1]) for i in range(made.layers)]
    return tokens
