"""ELECTRA discriminator (transformers ElectraForPreTraining), tiny random config."""

import torch
from transformers import ElectraConfig, ElectraForPreTraining

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = ElectraConfig(
    vocab_size=100,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
model = ElectraForPreTraining(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
