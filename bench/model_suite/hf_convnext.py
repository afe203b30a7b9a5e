"""ConvNeXt image classifier (transformers ConvNextForImageClassification), tiny config."""

import torch
from transformers import ConvNextConfig, ConvNextForImageClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = ConvNextConfig(
    hidden_sizes=[8, 16, 32, 64], depths=[1, 1, 1, 1], image_size=32, num_labels=10
)
model = ConvNextForImageClassification(config).eval()
example_args = (torch.randn(2, 3, 32, 32),)
