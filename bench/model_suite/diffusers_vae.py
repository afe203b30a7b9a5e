"""diffusers AutoencoderKL (encode then decode), tiny config, 32x32 images."""

import torch
from diffusers import AutoencoderKL

REQUIRES = ["diffusers"]

torch.manual_seed(0)
model = AutoencoderKL(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
    block_out_channels=(16, 32),
    layers_per_block=1,
    latent_channels=4,
    norm_num_groups=8,
    sample_size=32,
).eval()
example_args = (torch.randn(1, 3, 32, 32),)
