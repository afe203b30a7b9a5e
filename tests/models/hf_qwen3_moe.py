"""A tiny Qwen3MoeForCausalLM (random weights, 4 experts, top-2, no cache)."""

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

torch.manual_seed(0)
config = Qwen3MoeConfig(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    moe_intermediate_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    num_experts=4,
    num_experts_per_tok=2,
    max_position_embeddings=64,
    use_cache=False,
)
model = Qwen3MoeForCausalLM(config).eval()
example_kwargs = {
    "input_ids": torch.randint(0, 64, (1, 8)),
    "attention_mask": torch.ones(1, 8, dtype=torch.long),
}
