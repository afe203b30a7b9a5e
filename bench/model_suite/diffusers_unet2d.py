"""diffusers UNet2DModel (unconditional DDPM denoiser), tiny config, 32x32 images."""

import torch
from diffusers import UNet2DModel

REQUIRES = ["diffusers"]

torch.manual_seed(0)
model = UNet2DModel(
    sample_size=32,
    in_channels=3,
    out_channels=3,
    layers_per_block=1,
    block_out_channels=(16, 32),
    down_block_types=("DownBlock2D", "AttnDownBlock2D"),
    up_block_types=("AttnUpBlock2D", "UpBlock2D"),
    norm_num_groups=8,
    attention_head_dim=8,
).eval()
example_args = (torch.randn(2, 3, 32, 32), torch.tensor([10, 500]))
