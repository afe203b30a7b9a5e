"""T5 encoder-decoder (transformers T5ForConditionalGeneration), tiny random config."""

import torch
from transformers import T5Config, T5ForConditionalGeneration

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = T5Config(
    vocab_size=100,
    d_model=32,
    d_kv=8,
    d_ff=64,
    num_layers=2,
    num_heads=4,
    decoder_start_token_id=0,
    use_cache=False,
)
model = T5ForConditionalGeneration(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
example_kwargs = {"decoder_input_ids": torch.randint(0, 100, (2, 8))}
