"""Whisper speech-to-text encoder-decoder (transformers), tiny random config, no cache."""

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = WhisperConfig(
    vocab_size=100,
    num_mel_bins=16,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_source_positions=32,
    max_target_positions=32,
    pad_token_id=0,
    bos_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=1,
    suppress_tokens=None,
    begin_suppress_tokens=None,
    use_cache=False,
)
model = WhisperForConditionalGeneration(config).eval()
# Log-mel features: (batch, mel bins, 2 * max_source_positions frames).
example_args = (torch.randn(1, 16, 64),)
example_kwargs = {"decoder_input_ids": torch.tensor([[1, 5, 7, 9]])}
