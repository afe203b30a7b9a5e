import torch


class M(torch.nn.Module):
    def forward(self, x, *, y, scale=2.0):
        y.add_(x)
        return x * scale + y


model = M()
example_args = (torch.randn(4, 3),)
example_kwargs = {"y": torch.randn(4, 3)}
