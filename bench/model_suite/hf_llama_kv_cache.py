"""Llama decoding step with a KV cache: past keys/values in, logits and the new cache out."""

import torch
from torch import nn
from torch.export import Dim
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

REQUIRES = ["transformers"]

LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8


class LlamaWithCache(nn.Module):
    """The cache as plain tensors, stacked over layers: (layers, batch, kv_heads, len, head_dim)."""

    def __init__(self, lm: LlamaForCausalLM) -> None:
        super().__init__()
        self.lm = lm

    def forward(
        self, input_ids: torch.Tensor, past_keys: torch.Tensor, past_values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        layers = zip(past_keys.unbind(0), past_values.unbind(0), strict=True)
        cache = DynamicCache(ddp_cache_data=list(layers))
        out = self.lm(input_ids=input_ids, past_key_values=cache, use_cache=True)
        new = out.past_key_values
        keys = torch.stack([layer.keys for layer in new.layers])
        values = torch.stack([layer.values for layer in new.layers])
        return out.logits, keys, values


torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=LAYERS,
    num_attention_heads=4,
    num_key_value_heads=KV_HEADS,
    max_position_embeddings=64,
)
model = LlamaWithCache(LlamaForCausalLM(config)).eval()
past_len = 8
example_args = (
    torch.randint(0, 100, (2, 4)),
    torch.randn(LAYERS, 2, KV_HEADS, past_len, HEAD_DIM),
    torch.randn(LAYERS, 2, KV_HEADS, past_len, HEAD_DIM),
)
# A named Dim("past", max=48) fails here (torch 2.13 cannot prove a min() guard of the
# attention mask for its range); Dim.AUTO exports with the cache length dynamic.
past = Dim.AUTO
dynamic_shapes = {"input_ids": None, "past_keys": {3: past}, "past_values": {3: past}}
