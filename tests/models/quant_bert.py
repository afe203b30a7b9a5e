"""A tiny BERT encoder (random weights) for option `quantize`: its linears hold most of
its weights, as in real encoders; the sequence is dynamic up to 32."""

import torch
from torch.export import Dim
from transformers import BertConfig, BertModel

torch.manual_seed(0)
config = BertConfig(
    vocab_size=128,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=512,
    max_position_embeddings=64,
)
model = BertModel(config, add_pooling_layer=False).eval()
# With the attention mask, as encoders are called: transformers builds the 4-D mask from
# integer arithmetic (`arange + offset`) that PT2E must leave integer.
example_kwargs = {
    "input_ids": torch.randint(0, 128, (2, 16)),
    "attention_mask": torch.ones(2, 16, dtype=torch.long),
}
sequence = Dim("sequence_length", min=2, max=32)
dynamic_shapes = {"input_ids": {1: sequence}, "attention_mask": {1: sequence}}
