"""diffusers UNet2DConditionModel (cross-attention denoiser), tiny config, 16x16 latents."""

import torch
from diffusers import UNet2DConditionModel

REQUIRES = ["diffusers"]

torch.manual_seed(0)
model = UNet2DConditionModel(
    sample_size=16,
    in_channels=4,
    out_channels=4,
    layers_per_block=1,
    block_out_channels=(32, 64),
    down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
    cross_attention_dim=32,
    attention_head_dim=8,
    norm_num_groups=8,
).eval()
example_args = (torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 8, 32))
