"""Mistral language model (GQA, sliding-window attention), tiny random config, no cache."""

import torch
from transformers import MistralConfig, MistralForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = MistralConfig(
    vocab_size=100,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    sliding_window=8,
    use_cache=False,
)
model = MistralForCausalLM(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
