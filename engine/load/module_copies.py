"""Copies of a model that share its weights, and the check that the weights stayed as they
were.

An export runs the model many times (the eager reference, each verification sample on
both sides, the generation check, each target's verification), and each run must start
from the model's state as uploaded: a run may change buffers (a KV cache, batch-norm
statistics) and inputs in place. A full `copy.deepcopy` for each run also copies the
weights — a gigabyte for a 250M-parameter float32 model, twice per sample. The forward of
an exported program never changes its parameters (torch.export lists such a mutation in
the signature: `mutates_parameters`), nor does a well-behaved eager forward, so the runs
share the weights (`sharing_weights`: module structure, buffers and other tensors copied,
parameters the same tensors) and `WeightVersions` checks, by the tensors' version counters
and data pointers, that no run changed them.
"""

from __future__ import annotations

import copy
from typing import TypeVar

import torch
from torch.export.graph_signature import OutputKind

from engine.load import pages

__all__ = ["WeightVersions", "fresh", "mutates_parameters", "sharing_weights", "widened"]

Module = TypeVar("Module", bound=torch.nn.Module)


def sharing_weights(module: Module) -> Module:
    """A deep copy of `module` whose parameters are `module`'s own tensors."""
    memo: dict[int, object] = {id(parameter): parameter for parameter in module.parameters()}
    return copy.deepcopy(module, memo)


def widened(module: Module) -> Module:
    """A deep copy of `module` computing in float32: each bfloat16 or float16 parameter
    and buffer is a float32 tensor of its own, made once however many modules and
    attributes hold it (a tied LM head stays tied, a cache layer's tensor stays its
    wrapper's buffer); float32 parameters stay `module`'s own tensors. A reduced weight
    mapped from the checkpoint gives its pages back once widened (`pages.release`: read
    again if `module` runs again), so the two copies are not both resident."""
    reduced = (torch.bfloat16, torch.float16)
    memo: dict[int, object] = {}
    for parameter in module.parameters():
        if parameter.dtype not in reduced:
            memo[id(parameter)] = parameter
            continue
        memo[id(parameter)] = torch.nn.Parameter(parameter.detach().float(), requires_grad=False)
        pages.release(parameter)
    for buffer in module.buffers():
        if buffer.dtype in reduced:
            memo[id(buffer)] = buffer.float()
    return copy.deepcopy(module, memo)


def fresh(module: Module, *, share: bool) -> Module:
    """A copy of `module` for one run: sharing its weights (`sharing_weights`) or, when
    the program writes parameters (`mutates_parameters`), whole."""
    return sharing_weights(module) if share else copy.deepcopy(module)


def mutates_parameters(program: torch.export.ExportedProgram) -> bool:
    """Whether `program` writes any of its parameters (then its runs need own copies)."""
    return any(
        spec.kind == OutputKind.PARAMETER_MUTATION for spec in program.graph_signature.output_specs
    )


class WeightVersions:
    """The parameters of a module as they are now, to tell later whether any changed."""

    def __init__(self, module: torch.nn.Module) -> None:
        self._seen = {
            name: (parameter, parameter._version, parameter.data_ptr())
            for name, parameter in module.named_parameters()
        }

    def changed(self) -> list[str]:
        """The names of the parameters written in place (or given other data) since."""
        return [
            name
            for name, (parameter, version, pointer) in self._seen.items()
            if parameter._version != version or parameter.data_ptr() != pointer
        ]
