"""ViT image classifier (transformers ViTForImageClassification), tiny config, 32x32 images."""

import torch
from transformers import ViTConfig, ViTForImageClassification

REQUIRES = ["transformers"]

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
