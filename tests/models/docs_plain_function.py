import torch


def model(x, y):
    a = torch.sin(x)
    b = torch.cos(y)
    return a + b


example_args = (torch.randn(10, 10), torch.randn(10, 10))
