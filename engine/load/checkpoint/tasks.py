"""Tasks and the transformers auto classes that build their models.

The task names and the inference from `config.architectures` follow optimum
(`TasksManager.infer_task_from_model`): the architecture's class is looked up in the
auto classes' model mappings of the config's `model_type`; of the tasks whose mappings
name it, the one the class's name says wins (`…ForConditionalGeneration` is
text2text-generation, or speech recognition, before fill-mask), else the first in the
order of `TASKS`. A checkpoint with its own code
(`auto_map`) supports the tasks whose auto class `auto_map` names. A PEFT adapter's
`task_type` (`SEQ_CLS`, …) comes before the architectures: its head is the adapter's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from schemas import TaskName

__all__ = ["TASKS", "Loader", "TaskChoice", "choose_task", "loaders", "supported_tasks"]


@dataclass(frozen=True)
class Loader:
    """One auto class of a task and the name of its model mapping in transformers."""

    auto_class: str
    mapping: str


TASKS: dict[str, tuple[Loader, ...]] = {
    "text-generation": (Loader("AutoModelForCausalLM", "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),),
    "text-classification": (
        Loader(
            "AutoModelForSequenceClassification", "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"
        ),
    ),
    "token-classification": (
        Loader("AutoModelForTokenClassification", "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"),
    ),
    "question-answering": (
        Loader("AutoModelForQuestionAnswering", "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES"),
    ),
    "fill-mask": (Loader("AutoModelForMaskedLM", "MODEL_FOR_MASKED_LM_MAPPING_NAMES"),),
    "image-classification": (
        Loader("AutoModelForImageClassification", "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
    ),
    "object-detection": (
        Loader("AutoModelForObjectDetection", "MODEL_FOR_OBJECT_DETECTION_MAPPING_NAMES"),
    ),
    "semantic-segmentation": (
        Loader("AutoModelForSemanticSegmentation", "MODEL_FOR_SEMANTIC_SEGMENTATION_MAPPING_NAMES"),
    ),
    "automatic-speech-recognition": (
        Loader("AutoModelForSpeechSeq2Seq", "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES"),
        Loader("AutoModelForCTC", "MODEL_FOR_CTC_MAPPING_NAMES"),
    ),
    "text2text-generation": (
        Loader("AutoModelForSeq2SeqLM", "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    ),
    # last: every base model is in it, so a head's task wins when a class is in both
    "feature-extraction": (Loader("AutoModel", "MODEL_MAPPING_NAMES"),),
}
"""Task → the auto classes that build its model, tried in order."""

assert set(TASKS) == set(get_args(TaskName)), set(TASKS) ^ set(get_args(TaskName))


@dataclass(frozen=True)
class TaskChoice:
    """The task chosen, how, and the auto class that builds it."""

    task: str
    source: Literal["options", "architectures", "auto_map", "adapter"]
    """`options`, `architectures`, `auto_map` or `adapter` (the report's
    `checkpoint.task_source`)."""
    loader: Loader


def _names(value: Any) -> tuple[str, ...]:
    return tuple(value) if isinstance(value, tuple | list) else (str(value),)


def _mapping(name: str) -> Mapping[str, Any]:
    from transformers.models.auto import modeling_auto

    mapping: Mapping[str, Any] = getattr(modeling_auto, name, {})
    return mapping


def loaders(model_type: str, auto_map: Mapping[str, Any]) -> dict[str, Loader]:
    """Task → the first of its auto classes that can build `model_type` (or that
    `auto_map` names), for every task the checkpoint supports."""
    found: dict[str, Loader] = {}
    for task, candidates in TASKS.items():
        for loader in candidates:
            if loader.auto_class in auto_map or model_type in _mapping(loader.mapping):
                found[task] = loader
                break
    return found


def supported_tasks(model_type: str, auto_map: Mapping[str, Any]) -> list[str]:
    """The tasks a checkpoint of `model_type` (with its `auto_map`) can be exported for."""
    return list(loaders(model_type, auto_map))


def choose_task(
    requested: str | None,
    model_type: str,
    architectures: list[str],
    auto_map: Mapping[str, Any],
    adapter_task: str | None = None,
) -> TaskChoice | None:
    """The task to export for: `requested`, else `adapter_task` (a PEFT adapter's) where
    the checkpoint supports it, else the first task whose mapping (or `auto_map`) names
    one of `architectures`; None when none does.

    Raises:
        KeyError: `requested` is a task this checkpoint does not support.
    """
    available = loaders(model_type, auto_map)
    if requested is not None:
        return TaskChoice(requested, "options", available[requested])
    if adapter_task is not None and adapter_task in available:
        return TaskChoice(adapter_task, "adapter", available[adapter_task])
    for architecture in architectures:
        named: list[TaskChoice] = []
        for task, loader in available.items():
            if loader.auto_class in auto_map:
                if str(auto_map[loader.auto_class]).rsplit(".", 1)[-1] == architecture:
                    named.append(TaskChoice(task, "auto_map", loader))
            elif architecture in _names(_mapping(loader.mapping).get(model_type, ())):
                named.append(TaskChoice(task, "architectures", loader))
        if named:
            return _as_named(architecture, named)
    return None


_HEADS = {
    "ForCausalLM": ("text-generation",),
    "ForConditionalGeneration": ("automatic-speech-recognition", "text2text-generation"),
    "ForMaskedLM": ("fill-mask",),
    "ForSequenceClassification": ("text-classification",),
    "ForTokenClassification": ("token-classification",),
    "ForQuestionAnswering": ("question-answering",),
    "ForImageClassification": ("image-classification",),
    "ForObjectDetection": ("object-detection",),
    "ForSemanticSegmentation": ("semantic-segmentation",),
    "ForCTC": ("automatic-speech-recognition",),
    "ForSpeechSeq2Seq": ("automatic-speech-recognition",),
}
"""A class name's ending → the tasks it names, preferred in this order."""


def _as_named(architecture: str, named: list[TaskChoice]) -> TaskChoice:
    """Of the tasks whose auto classes build `architecture`, the one its name says (an
    `…ForConditionalGeneration` in the masked-LM list too is text2text), else the first."""
    for ending, tasks in _HEADS.items():
        if architecture.endswith(ending):
            for task in tasks:
                for choice in named:
                    if choice.task == task:
                        return choice
    return named[0]
