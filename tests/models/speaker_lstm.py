"""resemblyzer's speaker encoder shape, small: a 3-layer LSTM over mel frames, the last
layer's final hidden state through Linear + ReLU, L2-normalised."""

import torch
from torch import nn
from torch.export import Dim


class SpeakerEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(8, 16, 3, batch_first=True)
        self.linear = nn.Linear(16, 16)

    def forward(self, mels):
        _, (hidden, _) = self.lstm(mels)
        embedding = torch.relu(self.linear(hidden[-1]))
        return embedding / torch.norm(embedding, dim=1, keepdim=True)


model = SpeakerEncoder().eval()
example_args = (torch.randn(3, 12, 8),)
dynamic_shapes = {"mels": {0: Dim("batch", max=64)}}
