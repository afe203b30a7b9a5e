"""torchvision Faster R-CNN with a MobileNetV3 FPN backbone, random weights, one 64x64 image."""

import torch
from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

REQUIRES = ["torchvision"]

torch.manual_seed(0)
model = fasterrcnn_mobilenet_v3_large_320_fpn(
    weights=None, weights_backbone=None, num_classes=3, min_size=64, max_size=64
).eval()
example_args = ([torch.rand(3, 64, 64)],)
