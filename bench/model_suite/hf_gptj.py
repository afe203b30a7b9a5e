"""GPT-J language model with rotary embeddings (transformers GPTJForCausalLM), tiny config."""

import torch
from transformers import GPTJConfig, GPTJForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = GPTJConfig(
    vocab_size=100, n_embd=32, n_layer=2, n_head=4, rotary_dim=4, n_positions=64, use_cache=False
)
model = GPTJForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
