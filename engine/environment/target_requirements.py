"""What each deployment target needs on a worker besides torch, and whether it is there.

Torch-free (read from the targets' rows, `engine.targets.registry`), so that describing
a worker's environment (`engine.environment.libraries.describe_environment`, `torchport
env`, `GET /v1/environment`) can say which targets work without loading torch in the
worker's parent process: `missing` looks for the modules (`importlib.util.find_spec`) and,
for a target whose toolchain has `g++` (`aoti`), the C++ compiler; `IMPORT_CHECKS` are the
statements the environment check runs in a fresh interpreter like the jobs', since a
module that is found may still fail to import (executorch is installed without its
declared dependencies).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
from collections.abc import Mapping

from engine.targets.registry import TARGETS
from schemas import TargetSupport

__all__ = ["IMPORT_CHECKS", "describe_targets", "missing"]

IMPORT_CHECKS: dict[str, str] = {
    row.name: row.import_check for row in TARGETS.values() if row.import_check is not None
}
"""The statement that shows a target's packages import (`aoti` needs only torch and g++)."""


def missing(name: str) -> list[str]:
    """What target `name` needs that this machine lacks: modules that cannot be found,
    or for a target compiling C++ (`aoti`) the compiler (`$CXX`, else g++); empty when it
    can run."""
    absent = []
    if "g++" in TARGETS[name].toolchain:
        compiler = os.environ.get("CXX") or "g++"
        if shutil.which(compiler) is None:
            absent.append(compiler)
    for module in TARGETS[name].requires:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(module)
    return absent


def describe_targets(
    imports: Mapping[str, tuple[bool | None, str | None]] | None,
) -> list[TargetSupport]:
    """Each target, whether it works here, and what it lacks.

    Args:
        imports: the outcome `(ok, error)` of each target's `IMPORT_CHECKS` statement, by
            target name; None when imports were not checked (a target whose modules are
            all found then `works` None, not known).
    """
    described = []
    for name in TARGETS:
        absent = missing(name)
        if absent:
            described.append(TargetSupport(name=name, works=False, missing=absent))
            continue
        if name not in IMPORT_CHECKS:
            described.append(TargetSupport(name=name, works=True))
            continue
        ok, error = (imports or {}).get(name, (None, None))
        described.append(TargetSupport(name=name, works=ok, error=None if ok else error))
    return described
