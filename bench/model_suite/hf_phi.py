"""Phi language model (parallel attention and MLP, partial RoPE), tiny random config."""

import torch
from transformers import PhiConfig, PhiForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = PhiConfig(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
    use_cache=False,
)
model = PhiForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
