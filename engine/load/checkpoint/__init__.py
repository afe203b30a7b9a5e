"""Checkpoint uploads: a zip of a `save_pretrained` directory instead of model code.

`detection` finds the checkpoint among the unpacked files (no transformers needed),
`tasks` maps tasks to transformers' auto classes and infers the task from the config,
`example_inputs` makes the inputs and the dynamic shapes of a task, `adapters` finds a
PEFT adapter beside the checkpoint and merges it, and `building` builds the model, loads
its weights and hands the loading stage a `LoadedModel`; `tokenizer` finds its tokenizer
files and writes them beside the artifacts.
"""

from engine.load.checkpoint.adapters import refuse_adapter_only
from engine.load.checkpoint.building import load_checkpoint
from engine.load.checkpoint.detection import adapter_only_base, checkpoint_base

__all__ = ["adapter_only_base", "checkpoint_base", "load_checkpoint", "refuse_adapter_only"]
