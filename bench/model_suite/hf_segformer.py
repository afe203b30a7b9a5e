"""SegFormer semantic segmentation (transformers), tiny config, 64x64 images."""

import torch
from transformers import SegformerConfig, SegformerForSemanticSegmentation

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = SegformerConfig(
    num_encoder_blocks=2,
    depths=[1, 1],
    sr_ratios=[2, 1],
    hidden_sizes=[16, 32],
    num_attention_heads=[1, 2],
    patch_sizes=[7, 3],
    strides=[4, 2],
    decoder_hidden_size=32,
    num_labels=5,
)
model = SegformerForSemanticSegmentation(config).eval()
example_args = (torch.randn(1, 3, 64, 64),)
