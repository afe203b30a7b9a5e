"""Pegasus encoder-decoder (transformers PegasusForConditionalGeneration), tiny random config."""

import torch
from transformers import PegasusConfig, PegasusForConditionalGeneration

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = PegasusConfig(
    vocab_size=100,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
    use_cache=False,
)
model = PegasusForConditionalGeneration(config).eval()
example_args = (torch.randint(2, 100, (2, 16)),)
example_kwargs = {"decoder_input_ids": torch.randint(2, 100, (2, 8))}
