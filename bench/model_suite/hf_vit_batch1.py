"""ViT encoder exported from a batch-1 example with a dynamic batch of 1 to 8."""

import torch
from torch.export import Dim
from transformers import ViTConfig, ViTModel

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = ViTConfig(
    image_size=32,
    patch_size=8,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
)
model = ViTModel(config).eval()
example_args = (torch.randn(1, 3, 32, 32),)
dynamic_shapes = {"pixel_values": {0: Dim("batch", min=1, max=8)}}
