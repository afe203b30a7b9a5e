"""A tiny LlamaForCausalLM (random weights, no cache) with an example batch of 1."""

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
    use_cache=False,
)
model = LlamaForCausalLM(config).eval()
example_kwargs = {
    "input_ids": torch.randint(0, 64, (1, 8)),
    "attention_mask": torch.ones(1, 8, dtype=torch.long),
}
