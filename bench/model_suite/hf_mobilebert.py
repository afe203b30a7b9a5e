"""MobileBERT encoder with bottlenecks (transformers MobileBertModel), tiny random config."""

import torch
from transformers import MobileBertConfig, MobileBertModel

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = MobileBertConfig(
    vocab_size=100,
    embedding_size=16,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=32,
    intra_bottleneck_size=16,
    num_feedforward_networks=2,
    max_position_embeddings=64,
)
model = MobileBertModel(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
