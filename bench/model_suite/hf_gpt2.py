"""GPT-2 language model (transformers GPT2LMHeadModel), tiny random config, no cache."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64, use_cache=False)
model = GPT2LMHeadModel(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
