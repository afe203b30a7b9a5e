"""ResNet image classifier (transformers ResNetForImageClassification), tiny config."""

import torch
from transformers import ResNetConfig, ResNetForImageClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = ResNetConfig(
    embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10
)
model = ResNetForImageClassification(config).eval()
example_args = (torch.randn(2, 3, 32, 32),)
