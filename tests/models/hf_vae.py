"""A tiny diffusers AutoencoderKL (random weights): its core-ATen program raises
`Expected X.is_contiguous(memory_format)` when run (the decomposed group_norm), while the
program before decomposition runs."""

import torch
from diffusers import AutoencoderKL

torch.manual_seed(0)
model = AutoencoderKL(
    in_channels=3,
    out_channels=3,
    down_block_types=("DownEncoderBlock2D", "DownEncoderBlock2D"),
    up_block_types=("UpDecoderBlock2D", "UpDecoderBlock2D"),
    block_out_channels=(8, 16),
    layers_per_block=1,
    norm_num_groups=4,
    latent_channels=2,
    sample_size=32,
).eval()
example_args = (torch.randn(1, 3, 32, 32),)
