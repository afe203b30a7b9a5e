"""ViT-Base/16 (transformers ViTForImageClassification, its default config: 86M
parameters), random weights, one 224x224 image: a real-size transformer encoder."""

import torch
from transformers import ViTConfig, ViTForImageClassification

REQUIRES = ["transformers"]

torch.manual_seed(0)
model = ViTForImageClassification(ViTConfig(num_labels=1000)).eval()
example_args = (torch.randn(1, 3, 224, 224),)
