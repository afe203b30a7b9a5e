"""What the targets' own attention forms of a transformers LLM share (ExecuTorch's LLM
ops, `engine.targets.executorch_attention`; ONNX Runtime's GroupQueryAttention,
`engine.targets.onnx.attention`): the modules that call a transformers attention
function, registering a form's function (with no mask of transformers': each op is
causal itself), and the attention no such op computes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

__all__ = ["attention_modules", "calls", "register", "unplain"]


def attention_modules(model: torch.nn.Module) -> list[Any]:
    """The modules that call a transformers attention function: those with a `layer_idx`
    and an `is_causal` flag."""
    return [
        each
        for each in model.modules()
        if hasattr(each, "layer_idx") and hasattr(each, "is_causal")
    ]


def calls(program: torch.export.ExportedProgram, op: str) -> int:
    """How many times `program` calls an op whose name contains `op` (the layers whose
    attention went through a form's op)."""
    return sum(
        1 for node in program.graph.nodes if node.op == "call_function" and op in str(node.target)
    )


def _no_mask(*args: Any, **kwargs: Any) -> None:
    """A form's mask function: none."""
    return None


def register(name: str, attention: Callable[..., Any]) -> None:
    """`attention` as transformers' attention function `name`, with no mask."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, _no_mask)


def unplain(model: torch.nn.Module, window_below: int | None = None) -> str | None:
    """Why `model`'s attention is not plain causal attention over every past position,
    or None: sliding-window layers (with `window_below`, only windows shorter than it
    count), chunked or soft-capped scores, ALiBi biases, sinks, bidirectional or no
    attention modules."""
    config = cast(Any, model).config.get_text_config()
    types = set(getattr(config, "layer_types", None) or ())
    if types - {"full_attention"}:
        return f"its layers attend otherwise too ({', '.join(sorted(types - {'full_attention'}))})"
    window = getattr(config, "sliding_window", None)
    if (
        isinstance(window, int)
        and getattr(config, "use_sliding_window", True)
        and (window_below is None or window < window_below)
    ):
        of = "" if window_below is None else f" of the cache's {window_below}"
        return f"its attention slides over {window}{of} positions"
    if getattr(config, "attn_logit_softcapping", None) is not None:
        return "its attention scores are soft-capped"
    if getattr(config, "attention_chunk_size", None) is not None:
        return "its attention is chunked"
    if getattr(config, "alibi", False) or getattr(config, "position_embedding_type", "") == "alibi":
        return "its attention adds ALiBi biases"
    attention = attention_modules(model)
    if not attention:
        return "it has no attention modules transformers' attention functions serve"
    if any(not each.is_causal or hasattr(each, "sinks") for each in attention):
        return "its attention is not plain causal attention (sinks or bidirectional)"
    return None
