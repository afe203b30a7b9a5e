"""The upload's own code tries a socket at import, survives the refusal, and its program
fails verification later: the outcome is verification_failed, the attempt a warning."""

import socket

import torch

try:
    socket.socket().close()
except OSError:
    pass


class Model(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


model = Model()
example_args = (torch.zeros(4, 4),)
