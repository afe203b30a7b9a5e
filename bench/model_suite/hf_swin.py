"""Swin transformer image classifier (transformers SwinForImageClassification), tiny config."""

import torch
from transformers import SwinConfig, SwinForImageClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = SwinConfig(
    image_size=32,
    patch_size=2,
    embed_dim=16,
    depths=[1, 1],
    num_heads=[2, 4],
    window_size=4,
    num_labels=10,
)
model = SwinForImageClassification(config).eval()
example_args = (torch.randn(2, 3, 32, 32),)
