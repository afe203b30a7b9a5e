"""timm Vision Transformer (timm's tiny `test_vit` architecture) on 64x64 images."""

import timm
import torch

REQUIRES = ["timm", "torchvision"]

torch.manual_seed(0)
model = timm.create_model("test_vit", pretrained=False, img_size=64, num_classes=10).eval()
example_args = (torch.randn(2, 3, 64, 64),)
