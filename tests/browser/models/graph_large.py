"""A small transformer of about 800 ops once decomposed, in a module hierarchy
(`encoder.layers.N.attn.q`, …): the graph view's large-graph fixture."""

import torch
from torch import nn

WIDTH, HEADS, LAYERS = 16, 2, 14


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))

    def forward(self, x):
        batch, seq, _ = x.shape
        split = (batch, seq, HEADS, WIDTH // HEADS)
        q = self.q(x).view(split).transpose(1, 2)
        k = self.k(x).view(split).transpose(1, 2)
        v = self.v(x).view(split).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-1, -2) / (WIDTH // HEADS) ** 0.5, dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(batch, seq, WIDTH))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(WIDTH, 2 * WIDTH), nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x)))


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(64, WIDTH)
        self.encoder = Encoder()
        self.head = nn.Linear(WIDTH, 4)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)).mean(dim=1))


model = TinyTransformer().eval()
example_args = (torch.randint(0, 64, (2, 8)),)
