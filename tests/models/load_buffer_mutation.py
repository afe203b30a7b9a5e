"""Its forward mutates a buffer (a running count) and its input in place."""

import torch


class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(1))

    def forward(self, x):
        self.count.add_(1)
        x.mul_(2)
        return x + self.count


model = Counter()
example_args = (torch.ones(2),)
