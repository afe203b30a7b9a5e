"""A module-level dynamic_shapes that leaves out the non-tensor `use_cache` and a key of
the dict input `extra`, as specs written for Hugging Face models do."""

import torch
from torch.export import Dim


class UseCache(torch.nn.Module):
    def forward(self, input_ids, attention_mask, use_cache=False, extra=None):
        y = input_ids.float() * attention_mask
        if use_cache:
            y = y + extra["bias"]
        return y * extra["scale"]


model = UseCache()
example_args = (torch.ones(3, 5, dtype=torch.long),)
example_kwargs = {
    "attention_mask": torch.ones(3, 5),
    "use_cache": True,
    "extra": {"bias": torch.zeros(3, 5), "scale": torch.full((5,), 2.0)},
}
batch = Dim("batch", max=64)
dynamic_shapes = {
    "input_ids": {0: batch},
    "attention_mask": {0: batch},
    "extra": {"bias": {0: batch}},
}
