"""Falcon language model (multi-query attention, parallel blocks), tiny random config."""

import torch
from transformers import FalconConfig, FalconForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = FalconConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    multi_query=True,
    parallel_attn=True,
    use_cache=False,
)
model = FalconForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
