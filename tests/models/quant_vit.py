"""A tiny ViT classifier (random weights) for static `int8`: with its residual adds
quantized per tensor it misses the default budget (cosine ~0.94 against float), with
only its linears and convolution quantized it stays within it."""

import torch
from transformers import ViTConfig, ViTForImageClassification

torch.manual_seed(0)
config = ViTConfig(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    num_labels=10,
)
model = ViTForImageClassification(config).eval()
example_args = (torch.randn(2, 3, 32, 32),)
