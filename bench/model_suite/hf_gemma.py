"""Gemma language model (multi-query attention, GeGLU), tiny random config, no cache."""

import torch
from transformers import GemmaConfig, GemmaForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = GemmaConfig(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=8,
    max_position_embeddings=64,
    use_cache=False,
)
model = GemmaForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
