"""torchvision ResNet-18, random weights (weights=None), 64x64 images."""

import torch
from torchvision.models import resnet18

REQUIRES = ["torchvision"]

torch.manual_seed(0)
model = resnet18(weights=None, num_classes=10).eval()
example_args = (torch.randn(2, 3, 64, 64),)
