import torch


class ContextManager:
    def __init__(self):
        self.count = 0

    def __enter__(self):
        self.count += 1

    def __exit__(self, exc_type, exc_value, traceback):
        self.count -= 1


class M(torch.nn.Module):
    def forward(self, x):
        with ContextManager():
            return x.sin() + x.cos()


model = M()
example_args = (torch.randn(3, 3),)
