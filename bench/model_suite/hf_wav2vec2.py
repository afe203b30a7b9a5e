"""wav2vec 2.0 CTC speech recogniser (transformers Wav2Vec2ForCTC), tiny config."""

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForCTC

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = Wav2Vec2Config(
    vocab_size=32,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    conv_dim=(16, 16),
    conv_stride=(5, 2),
    conv_kernel=(10, 3),
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=4,
)
model = Wav2Vec2ForCTC(config).eval()
example_args = (torch.randn(1, 1600),)  # 0.1 s of 16 kHz audio
