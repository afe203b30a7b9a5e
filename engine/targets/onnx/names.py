"""The names an ONNX model's inputs and outputs carry: the user's, as optimum names them.

- inputs: the `forward` parameter each tensor leaf binds to, with the path inside a
  container argument dotted on (`input_ids`, `past_key_values.0.key`);
- outputs: the output structure flattened: keys of a dict or `ModelOutput` (`logits`,
  `last_hidden_state`), positions of a tuple as `output_0`, `output_1`, nested paths
  dotted (`a.0`), a lone tensor `output`;
- a Hugging Face cache flattened by the portable wrapper (`past_key_values.layers.0.keys`)
  takes optimum's names: `past_key_values.0.key` as an input, `present.0.key` as an output.

Plain functions of the module's signature, the example inputs and the program's output
spec; no ONNX package needed. `name_values` gives an exported model's graph values those
names (onnx_ir, imported when called).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from engine.load.inputs import parameter_names

__all__ = ["input_names", "name_values", "output_names", "task"]

_CACHE = re.compile(r"^past_key_values\.layers\.(\d+)\.(key|value)s$")

_TASKS = (
    ("ForCausalLM", "text-generation"),
    ("ForConditionalGeneration", "text2text-generation"),
    ("ForSequenceClassification", "text-classification"),
    ("ForTokenClassification", "token-classification"),
    ("ForQuestionAnswering", "question-answering"),
    ("ForMaskedLM", "fill-mask"),
    ("ForImageClassification", "image-classification"),
    ("ForSemanticSegmentation", "semantic-segmentation"),
    ("ForObjectDetection", "object-detection"),
    ("ForSpeechSeq2Seq", "automatic-speech-recognition"),
)
"""Class-name endings of Hugging Face models and optimum's task for each."""


def input_names(
    forward: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> list[str] | None:
    """One name per tensor leaf of `(args, kwargs)`, in order; None when the inputs do
    not bind to `forward`'s signature or two leaves would share a name."""
    by_position = parameter_names(forward, args, kwargs)
    if not by_position:
        return None
    try:
        flat = pytree.tree_flatten_with_path((tuple(args), dict(kwargs)))[0]
    except Exception:  # a container type without key paths
        return None
    names = []
    for keys, leaf in flat:
        if not isinstance(leaf, torch.Tensor):
            continue  # a constant of the model, not an input
        if len(keys) < 2:
            return None
        side, key = getattr(keys[0], "idx", 0), _key(keys[1])
        # A `*args` position has no name of its own: `args.<position>`.
        top = by_position.get((side, key)) or (f"args.{key}" if side == 0 else None)
        if top is None:
            return None
        names.append(_optimum(".".join([top, *(_key_text(k) for k in keys[2:])]), "input"))
    return names if len(set(names)) == len(names) else None


def output_names(spec: pytree.TreeSpec | None) -> list[str] | None:
    """One name per leaf of the program's output spec, in order; None when the spec has
    no key paths or two leaves would share a name."""
    if spec is None:
        return None
    try:
        skeleton = pytree.tree_unflatten(list(range(spec.num_leaves)), spec)
        flat = pytree.tree_flatten_with_path(skeleton)[0]
    except Exception:  # a registered node type without flatten_with_keys
        return None
    names = []
    for keys, _ in flat:
        if not keys:
            names.append("output")
            continue
        parts = [_key_text(k) for k in keys]
        if isinstance(keys[0], pytree.SequenceKey):
            parts[0] = f"output_{parts[0]}"
        names.append(_optimum(".".join(parts), "output"))
    return names if len(set(names)) == len(names) else None


def task(module: torch.nn.Module) -> str | None:
    """optimum's task name for a Hugging Face model class (`LlamaForCausalLM` →
    `text-generation`), through a portable wrapper; None for anything else."""
    original = module.__dict__.get("_torchport_original", module)
    name = type(original).__name__
    if getattr(original, "config", None) is None:
        return None
    for ending, task_name in _TASKS:
        if name.endswith(ending):
            return task_name
    return "feature-extraction" if name.endswith("Model") else None


def _key(key: Any) -> Any:
    return getattr(key, "idx", getattr(key, "key", getattr(key, "name", None)))


def _key_text(key: Any) -> str:
    return str(_key(key))


def _optimum(name: str, side: str) -> str:
    match = _CACHE.match(name)
    if match is None:
        return name
    head = "past_key_values" if side == "input" else "present"
    return f"{head}.{match.group(1)}.{match.group(2)}"


def name_values(
    model: Any, input_names: Sequence[str] | None, output_names: Sequence[str] | None
) -> None:
    """Give the graph's inputs and its last outputs (the user's: mutated buffers come
    first) the names asked for. An intermediate value holding a name is renamed; an
    output name an input or initializer already has gets `.output` appended; an output
    that is also an input, or listed twice, is given an Identity of its own."""
    import onnx_ir as ir

    graph = model.graph
    values = {
        id(v): v
        for v in [*graph.inputs, *graph.outputs]
        + [out for node in ir.traversal.RecursiveGraphIterator(graph) for out in node.outputs]
    }
    reserved = set(graph.initializers)
    inputs = list(graph.inputs)
    if input_names is not None and len(input_names) == len(inputs):
        for value, name in zip(inputs, input_names, strict=True):
            claim(values.values(), reserved, value, name)
    outputs = list(graph.outputs)
    if not output_names or len(output_names) > len(outputs):
        return
    first = len(outputs) - len(output_names)
    seen: set[int] = set()
    for index, name in enumerate(output_names, start=first):
        value = outputs[index]
        if value.is_graph_input() or id(value) in seen or value.name in graph.initializers:
            node = ir.Node("", "Identity", inputs=[value], num_outputs=1)
            graph.append(node)
            copy = node.outputs[0]
            copy.shape, copy.type = value.shape, value.type
            graph.outputs[index] = copy
            values[id(copy)] = copy
            value = copy
        seen.add(id(value))
        claim(values.values(), reserved, value, name)


def claim(values: Any, reserved: set[str], value: Any, name: str) -> None:
    """Name `value` `name` (or `name.output` when an input, initializer or earlier
    output has it); any other value of that name is renamed out of the way."""
    while name in reserved:
        name = f"{name}.output"
    for other in values:
        if other is not value and other.name == name:
            other.name = f"{name}.{id(other):x}"
    value.name = name
    reserved.add(name)
