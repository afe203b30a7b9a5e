# Not hostile, but the case that hangs a fork of a process whose intra-op pool is running:
# a big matmul at import and in forward must finish in a forked child.
import torch

a = torch.randn(512, 512)
warm = (a @ a).sum() + torch.randn(1 << 20).exp().sum()


class Model(torch.nn.Module):
    def forward(self, x):
        return (x @ x).relu()


model = Model()
example_args = (torch.randn(256, 256),)
