"""BLOOM language model (ALiBi positions), tiny random config, no cache."""

import torch
from transformers import BloomConfig, BloomForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = BloomConfig(vocab_size=100, hidden_size=32, n_layer=2, n_head=4, use_cache=False)
model = BloomForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
