"""The ONNX form of a generation-ready LLM's attention: ONNX Runtime's
`GroupQueryAttention`, as ONNX Runtime GenAI's model builder writes it.

The generic form (`engine.generation.onnx_past`) spells attention out: the past and new
keys concatenated, each key/value head repeated for its query heads, a causal and padding
mask built from `attention_mask`, then matmuls and a softmax, about 40 nodes per layer
and a copy of the whole repeated cache at every step. ONNX Runtime's contrib op
`com.microsoft::GroupQueryAttention` does all of it in one node, over the key/value heads
as they are.

`form` makes the form from the eager transformers model: a copy sharing its weights whose
attention is `torchport::group_query_attention` (a transformers attention function
registered under `ATTENTION`, with no mask of transformers': the op is causal itself and
reads each row's length from `attention_mask`), and whose cache layers hand the op the
past and take its present instead of concatenating themselves. The op is a torch custom
op with an eager kernel (the program runs and is verified with it) and a translation to
the ONNX node (`TRANSLATIONS`). The model's inputs, outputs and names are the generic
form's, so ONNX Runtime GenAI runs it by the same `genai_config.json`.

The op reads `attention_mask` as ONNX Runtime GenAI feeds it: each row's count of ones is
its length (past and new tokens), its new tokens the last ones: rows padded on the left
are not what it computes (`onnx.custom_ops: false` keeps the generic form, which takes
any mask). A model the op does not fit keeps the generic form, and the report says why
(`unsuited`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from engine.generation import attention_forms
from engine.generation.ready import subclass
from engine.load import module_copies

if TYPE_CHECKING:
    from engine.generation.onnx_past import PastProgram
    from engine.targets.interface import TargetJob

__all__ = [
    "ATTENTION",
    "NODE",
    "OP",
    "TRANSLATIONS",
    "facts",
    "form",
    "lowered_attention",
    "past_program",
    "unsuited",
]

ATTENTION = "torchport_onnx_gqa"
"""The transformers attention (and mask) function name of the form."""
OP = "torchport::group_query_attention"
"""The torch custom op the form's attention calls."""
NODE = "com.microsoft::GroupQueryAttention"
"""What `details.attention` says of the form."""


@torch.library.custom_op(OP, mutates_args=())
def group_query_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    past_key: torch.Tensor,
    past_value: torch.Tensor,
    attention_mask: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Causal attention of the new tokens' `query` ([batch, heads, new, head_dim]) over
    the past and new keys and values (`key`, `value`: [batch, kv_heads, new, head_dim];
    `past_*`: [batch, kv_heads, past, head_dim]), as ONNX Runtime's GroupQueryAttention
    computes it: row `b`'s length is `attention_mask[b].sum()`, its new tokens the last
    `new` of it, and query `i` sees the keys up to its own position. Returns the output
    ([batch, new, heads, head_dim]) and the present keys and values (past + new)."""
    present_key = torch.cat([past_key, key], dim=2)
    present_value = torch.cat([past_value, value], dim=2)
    groups = query.shape[1] // key.shape[1]
    keys = present_key.repeat_interleave(groups, dim=1)
    values = present_value.repeat_interleave(groups, dim=1)
    new, total = query.shape[2], keys.shape[2]
    lengths = attention_mask.to(torch.long).sum(dim=1)  # [batch]
    last = (lengths - new).view(-1, 1, 1) + torch.arange(new).view(1, -1, 1)  # [b, new, 1]
    visible = torch.arange(total).view(1, 1, -1) <= last  # [batch, new, total]
    out = torch.nn.functional.scaled_dot_product_attention(
        query, keys, values, attn_mask=visible.unsqueeze(1), scale=scale
    )
    return out.transpose(1, 2).contiguous(), present_key, present_value


@group_query_attention.register_fake
def _(*args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    query, key, value, past_key, past_value = args[:5]
    batch, heads, new, head_dim = query.shape
    present = torch.cat([past_key, key], dim=2)
    return (
        query.new_empty(batch, new, heads, head_dim),
        present,
        torch.cat([past_value, value], dim=2),
    )


def _schema() -> Any:
    """The part of ONNX Runtime's `com.microsoft::GroupQueryAttention` schema the form
    uses (onnx has none of ONNX Runtime's contrib ops; the exporter's tracer needs one)."""
    from onnx.defs import OpSchema

    def tensor(name: str, kind: str) -> Any:
        return OpSchema.FormalParameter(name, kind)

    floats = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
    return OpSchema(
        "GroupQueryAttention",
        "com.microsoft",
        1,
        inputs=[
            *(tensor(name, "T") for name in ("query", "key", "value", "past_key", "past_value")),
            tensor("seqlens_k", "M"),
            tensor("total_sequence_length", "M"),
        ],
        outputs=[tensor(name, "T") for name in ("output", "present_key", "present_value")],
        type_constraints=[("T", floats, ""), ("M", ["tensor(int32)"], "")],
        attributes=[
            OpSchema.Attribute("num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("kv_num_heads", OpSchema.AttrType.INT, ""),
            OpSchema.Attribute("scale", OpSchema.AttrType.FLOAT, ""),
        ],
    )


def _translation(
    query: Any,
    key: Any,
    value: Any,
    past_key: Any,
    past_value: Any,
    attention_mask: Any,
    scale: float,
) -> tuple[Any, Any, Any]:
    """The op as ONNX Runtime's `com.microsoft::GroupQueryAttention` node: inputs as
    [batch, new, heads * head_dim], `seqlens_k` (each row's length - 1, int32) and
    `total_sequence_length` (the mask's length) from `attention_mask`."""
    import onnx_ir as ir
    from onnxscript import opset18
    from onnxscript.values import Op, Opset

    op: Any = opset18
    heads, head_dim = query.shape[1], query.shape[3]
    kv_heads = key.shape[1]

    def flat(states: Any) -> Any:
        return op.Reshape(op.Transpose(states, perm=[0, 2, 1, 3]), [0, 0, -1])

    lengths = op.ReduceSum(attention_mask, [1], keepdims=0)
    seqlens = op.Cast(op.Sub(lengths, op.CastLike(1, lengths)), to=ir.DataType.INT32)
    total = op.Cast(op.Squeeze(op.Shape(attention_mask, start=1, end=2)), to=ir.DataType.INT32)
    out, present_key, present_value = Op(
        Opset("com.microsoft", 1), "GroupQueryAttention", _schema()
    )(
        flat(query),
        flat(key),
        flat(value),
        past_key,
        past_value,
        seqlens,
        total,
        num_heads=heads,
        kv_num_heads=kv_heads,
        scale=scale,
    )
    return op.Reshape(out, [0, 0, heads, head_dim]), present_key, present_value


TRANSLATIONS: dict[Callable[..., Any], Callable[..., Any]] = {
    torch.ops.torchport.group_query_attention.default: _translation,
}
"""`custom_translation_table` entries for `torch.onnx.export(..., dynamo=True)`."""


def _attention(
    module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    *mask: Any, scaling: float | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:  # fmt: skip
    """transformers' attention interface over the op (transformers' mask, none here, and
    dropout, none in eval, unused): `key` and `value` are the new tokens' (`_update`), the
    past is the module's cache layer's, which takes the present."""
    layer: Any = module.torchport_layer
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out, layer.keys, layer.values = torch.ops.torchport.group_query_attention(
        query, key, value, layer.keys, layer.values, layer.torchport_mask, scale
    )
    return out, None


def _update(
    layer: Any, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """`DynamicLayer.update` of the form: the new keys and values as they are (the op
    appends them to the past)."""
    return key_states, value_states


def unsuited(model: torch.nn.Module) -> str | None:
    """Why `model` (a decoder-only transformers LLM) keeps the generic attention in
    ONNX, or None when the op may fit it (`lowered_attention` tells after tracing)."""
    return attention_forms.unplain(model)  # bfloat16 too: the model is widened to float32


def form(model: torch.nn.Module) -> tuple[torch.nn.Module, Callable[[Any, torch.Tensor], None]]:
    """A copy of `model` (sharing its weights) whose attention is the op, and what readies
    a call's cache for it: its layers hand the op the past and take the present, and
    know the call's `attention_mask`."""
    attention_forms.register(ATTENTION, _attention)
    copy: Any = module_copies.sharing_weights(model)
    modules = attention_forms.attention_modules(copy)
    for module in modules:
        module.config._attn_implementation = ATTENTION
    copy.config._attn_implementation = ATTENTION

    def ready(cache: Any, attention_mask: torch.Tensor) -> None:
        for layer in cache.layers:
            layer.__class__ = subclass(
                type(layer), prefix="GroupQuery", module=__name__, update=_update
            )
            layer.torchport_mask = attention_mask
        for module in modules:
            module.torchport_layer = cache.layers[module.layer_idx]

    return copy, ready


def lowered_attention(program: torch.export.ExportedProgram) -> int:
    """How many times `program` calls the op."""
    return attention_forms.calls(program, "group_query_attention")


def facts(attention: str | None) -> dict[str, str]:
    """`details.attention` (and `attention_reason`) of the target for `past_program`'s
    attention (None: not a generation-ready LLM)."""
    if attention is None:
        return {}
    if attention == NODE:
        return {"attention": NODE}
    return {"attention": "standard", "attention_reason": attention}


def past_program(job: TargetJob) -> tuple[PastProgram, str]:
    """The past/present program of a job's generation-ready LLM and its attention: a
    decoder-only one's in `form` (`NODE`) where the node fits, else the generic form
    and why."""
    from engine.generation import onnx_past

    generation = job.generation
    assert generation is not None
    if generation.encoder is not None:
        return onnx_past.past_program(generation), "an encoder-decoder model's decoder"
    if not job.options.onnx.custom_ops:
        return onnx_past.past_program(generation), "onnx.custom_ops is false"
    why = unsuited(generation.model)
    if why is None:
        try:
            with_past = onnx_past.past_program(generation, form)
        except Exception as exc:  # the generic form may still trace: a note, not a failure
            why = f"the GroupQueryAttention form did not export ({type(exc).__name__}: {exc})"
        else:
            found = lowered_attention(with_past.program)
            if found == with_past.layers:
                return with_past, NODE
            why = f"{found} of {with_past.layers} layers' attention went through the op"
    return onnx_past.past_program(generation), why[:400]
