"""BERT-base (transformers BertModel, its default config: 110M parameters), random
weights, one sequence of 128 tokens with its attention mask: a real-size text encoder."""

import torch
from transformers import BertConfig, BertModel

REQUIRES = ["transformers"]

torch.manual_seed(0)
model = BertModel(BertConfig()).eval()
example_kwargs = {
    "input_ids": torch.randint(0, 30522, (1, 128)),
    "attention_mask": torch.ones(1, 128, dtype=torch.long),
}
