"""timm ResNet (timm's tiny `test_resnet` architecture), random weights, 64x64 images."""

import timm
import torch

REQUIRES = ["timm", "torchvision"]

torch.manual_seed(0)
model = timm.create_model("test_resnet", pretrained=False, num_classes=10).eval()
example_args = (torch.randn(2, 3, 64, 64),)
