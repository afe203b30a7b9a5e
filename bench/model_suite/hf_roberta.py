"""RoBERTa masked language model (transformers RobertaForMaskedLM), tiny random config."""

import torch
from transformers import RobertaConfig, RobertaForMaskedLM

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = RobertaConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=66,
    pad_token_id=1,
)
model = RobertaForMaskedLM(config).eval()
example_args = (torch.randint(2, 100, (2, 16)),)
