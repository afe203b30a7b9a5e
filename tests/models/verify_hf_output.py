"""Outputs like Hugging Face's: a ModelOutput (an OrderedDict subclass registered as a
pytree node under its own serialized name, as transformers does) holding a namedtuple
registered the same way, and a namedtuple input. Saving works; loading needs this module.
"""

import collections
import functools

import torch
import torch.utils._pytree as pytree


class ModelOutput(collections.OrderedDict):
    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        pytree.register_pytree_node(
            cls,
            lambda out: (list(out.values()), list(out.keys())),
            functools.partial(_unflatten, cls),
            serialized_type_name=f"{cls.__module__}.{cls.__name__}",
        )

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def _unflatten(cls, values, keys):
    return cls(zip(keys, values))


class EncoderOutput(ModelOutput):
    pass


Pair = collections.namedtuple("Pair", ["first", "second"])
pytree._register_namedtuple(Pair, serialized_type_name=f"{__name__}.Pair")


class Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x, pair):
        hidden = self.proj(x)
        return EncoderOutput(
            logits=hidden.softmax(-1) * pair.first, states=Pair(hidden, x + pair.second)
        )


model = Encoder()
example_args = (torch.randn(2, 4), Pair(torch.randn(2, 4), torch.randn(2, 4)))
