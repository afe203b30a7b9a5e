"""torchvision MobileNetV3-Small, random weights (weights=None), 64x64 images."""

import torch
from torchvision.models import mobilenet_v3_small

REQUIRES = ["torchvision"]

torch.manual_seed(0)
model = mobilenet_v3_small(weights=None, num_classes=10).eval()
example_args = (torch.randn(2, 3, 64, 64),)
