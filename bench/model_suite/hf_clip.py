"""CLIP text and image towers with their similarity logits (transformers CLIPModel), tiny."""

import torch
from transformers import CLIPConfig, CLIPModel

REQUIRES = ["transformers"]

torch.manual_seed(0)
config = CLIPConfig(
    text_config={
        "vocab_size": 100,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "max_position_embeddings": 32,
    },
    vision_config={
        "image_size": 32,
        "patch_size": 8,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    },
    projection_dim=16,
)
model = CLIPModel(config).eval()
example_args = (torch.randint(0, 100, (2, 8)), torch.randn(3, 3, 32, 32))
