"""DeBERTa-v2 encoder with relative attention (transformers), tiny random config."""

import torch
from transformers import DebertaV2Config, DebertaV2Model

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = DebertaV2Config(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
    relative_attention=True,
    position_buckets=16,
    pos_att_type=["p2c", "c2p"],
)
model = DebertaV2Model(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
