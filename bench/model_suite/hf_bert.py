"""BERT encoder (transformers BertModel), tiny random config."""

import torch
from transformers import BertConfig, BertModel

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
model = BertModel(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
example_kwargs = {"attention_mask": torch.ones(2, 16, dtype=torch.long)}
