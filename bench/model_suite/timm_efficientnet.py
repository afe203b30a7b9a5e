"""timm EfficientNet (timm's tiny `test_efficientnet` architecture), random weights."""

import timm
import torch

REQUIRES = ["timm", "torchvision"]

torch.manual_seed(0)
model = timm.create_model("test_efficientnet", pretrained=False, num_classes=10).eval()
example_args = (torch.randn(2, 3, 64, 64),)
