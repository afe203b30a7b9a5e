"""GPT-Neo language model with global and local attention layers (transformers), tiny config."""

import torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = GPTNeoConfig(
    vocab_size=100,
    hidden_size=32,
    num_layers=2,
    num_heads=4,
    intermediate_size=64,
    attention_types=[[["global", "local"], 1]],
    window_size=8,
    max_position_embeddings=64,
    use_cache=False,
)
model = GPTNeoForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
