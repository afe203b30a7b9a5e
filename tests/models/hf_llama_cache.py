"""A tiny LlamaForCausalLM (random weights) with use_cache=True: it returns a
`DynamicCache` (no pytree node: its tensors sit in `layers[i].keys/values`)."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(
    vocab_size=64,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    use_cache=True,
)
model = LlamaForCausalLM(config).eval()
example_kwargs = {
    "input_ids": torch.randint(0, 64, (2, 8)),
    "attention_mask": torch.ones(2, 8, dtype=torch.long),
}
