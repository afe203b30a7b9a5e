"""`--task` of `torchport export` and `submit`: the contract's task names, and optimum's.

optimum names the same tasks with synonyms (`causal-lm`, `seq2seq-lm`, `masked-lm`, …,
its `TasksManager._SYNONYM_TASK_MAP`) and with a `-with-past` suffix for a model that
carries its KV cache in and out (`text-generation-with-past`). A checkpoint exported for
`text-generation` or `text2text-generation` has its cache already (option
`generation.cache`, on where transformers can give one), so each of these names maps to
the contract's task; anything else is a usage error that lists the valid names.
"""

from __future__ import annotations

from typing import get_args

from pydantic import TypeAdapter, ValidationError

from schemas import ErrorBody
from schemas.options import TaskName
from schemas.outcomes import validation_items

__all__ = ["OPTIMUM_SYNONYMS", "TASKS", "UnknownTask", "contract_task"]

TASKS: tuple[str, ...] = get_args(TaskName)
"""The contract's tasks (option `task`)."""

OPTIMUM_SYNONYMS: dict[str, str] = {
    "audio-ctc": "automatic-speech-recognition",
    "causal-lm": "text-generation",
    "default": "feature-extraction",
    "masked-lm": "fill-mask",
    "sentence-similarity": "feature-extraction",
    "seq2seq-lm": "text2text-generation",
    "sequence-classification": "text-classification",
    "speech2seq-lm": "automatic-speech-recognition",
    "summarization": "text2text-generation",
    "translation": "text2text-generation",
    "zero-shot-classification": "text-classification",
}
"""optimum's synonyms (optimum/exporters/tasks.py, `_SYNONYM_TASK_MAP`) of the contract's
tasks; each may also carry `-with-past`."""

_WITH_PAST = "-with-past"


class UnknownTask(ValueError):
    """`--task` names no task of the contract nor an optimum name of one; `body` is the
    usage error (`invalid_request`, `details.valid`: the contract's tasks; `details.errors`:
    the option's validation error, as for any invalid option)."""

    def __init__(self, task: str) -> None:
        super().__init__(f"--task {task} is not a task torchport exports.")
        self.body = ErrorBody(
            code="invalid_request",
            message=str(self),
            hint="Use one of: " + ", ".join(TASKS) + " (optimum's names, such as "
            "text-generation-with-past or causal-lm, are taken too); leave --task out to "
            "infer it from config.architectures.",
            details={
                "argument": "--task",
                "task": task,
                "valid": list(TASKS),
                "errors": _validation_errors(task),
            },
        )


def _validation_errors(task: str) -> list[dict[str, object]]:
    """The option's own validation error (`details.errors`, as for any invalid option:
    `field` `task`)."""
    try:
        TypeAdapter(TaskName).validate_python(task)
    except ValidationError as exc:
        return [{**item, "field": "task"} for item in validation_items(exc.errors())]
    return []


def contract_task(name: str) -> str:
    """The contract's task for `name`: itself, or what optimum's name of it means.

    Raises:
        UnknownTask: `name` is neither.
    """
    base = name.removesuffix(_WITH_PAST)
    task = OPTIMUM_SYNONYMS.get(base, base)
    if task not in TASKS:
        raise UnknownTask(name)
    return task
