"""DistilBERT sequence classifier (transformers), tiny random config."""

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = DistilBertConfig(
    vocab_size=100,
    dim=32,
    n_layers=2,
    n_heads=4,
    hidden_dim=64,
    max_position_embeddings=64,
    num_labels=2,
)
model = DistilBertForSequenceClassification(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
example_kwargs = {"attention_mask": torch.ones(2, 16, dtype=torch.long)}
