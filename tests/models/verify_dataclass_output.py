"""A dataclass output registered with register_dataclass and no serialized name, holding a
plain namedtuple: torch.export.export works, torch.export.save does not."""

import collections
import dataclasses

import torch

Scores = collections.namedtuple("Scores", ["low", "high"])


@dataclasses.dataclass
class Prediction:
    value: torch.Tensor
    scores: Scores


torch.export.register_dataclass(Prediction)


class Head(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x):
        value = self.linear(x)
        return Prediction(value=value, scores=Scores(value.min(-1).values, value.max(-1).values))


model = Head()
example_args = (torch.randn(5, 3),)
