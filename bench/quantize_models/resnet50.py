"""ResNet-50 (transformers ResNetForImageClassification, its default config: 25.6M
parameters), random weights, one 224x224 image: the real-size CNN of bench/quantize.py."""

import torch
from transformers import ResNetConfig, ResNetForImageClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
model = ResNetForImageClassification(ResNetConfig()).eval()
example_args = (torch.randn(1, 3, 224, 224),)
