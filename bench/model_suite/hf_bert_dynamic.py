"""BERT sequence classifier with a dynamic batch and sequence length."""

import torch
from torch.export import Dim
from transformers import BertConfig, BertForSequenceClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    num_labels=3,
)
model = BertForSequenceClassification(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
example_kwargs = {"attention_mask": torch.ones(2, 16, dtype=torch.long)}
batch = Dim("batch", min=1, max=8)
seq = Dim("seq", min=2, max=64)
dynamic_shapes = {
    "input_ids": {0: batch, 1: seq},
    "attention_mask": {0: batch, 1: seq},
}
