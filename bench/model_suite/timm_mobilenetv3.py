"""timm MobileNetV3-Small at width 0.5 (`mobilenetv3_small_050`), random weights."""

import timm
import torch

REQUIRES = ["timm", "torchvision"]

torch.manual_seed(0)
model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=10).eval()
example_args = (torch.randn(2, 3, 64, 64),)
