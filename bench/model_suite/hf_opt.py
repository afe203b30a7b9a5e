"""OPT language model (transformers OPTForCausalLM), tiny random config, no cache."""

import torch
from transformers import OPTConfig, OPTForCausalLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = OPTConfig(
    vocab_size=100,
    hidden_size=32,
    word_embed_proj_dim=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    ffn_dim=64,
    max_position_embeddings=64,
    use_cache=False,
)
model = OPTForCausalLM(config).eval()
example_args = (torch.randint(2, 100, (2, 16)),)
example_kwargs = {"attention_mask": torch.ones(2, 16, dtype=torch.long)}
