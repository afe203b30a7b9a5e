"""A crepe-like pitch CNN built without `.eval()`: its BatchNorm and Dropout layers are in
training mode. Its running statistics are those of a trained model, so on a batch of one
frame the training-mode answer (batch statistics) is far from the eval-mode one."""

import torch
from torch import nn

torch.manual_seed(0)


class PitchNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for cin, cout in ((1, 8), (8, 8)):
            layers += [
                nn.Conv1d(cin, cout, 5, padding=2),
                nn.ReLU(),
                nn.BatchNorm1d(cout),
                nn.MaxPool1d(2),
                nn.Dropout(0.25),
            ]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(8 * 16, 36)
        with torch.no_grad():  # as after training
            for layer in self.features:
                if isinstance(layer, nn.BatchNorm1d):
                    layer.running_mean.uniform_(0.0, 0.5)
                    layer.running_var.uniform_(0.5, 2.0)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.features(frames.unsqueeze(1))
        return torch.sigmoid(self.classifier(x.flatten(1)))


model = PitchNet()  # no .eval(): the layers above are in training mode
example_args = (torch.randn(1, 64),)
