"""The `TORCHPORT_*` variable names the deployables actually read, from their settings classes.

Deployment files must only set variables some settings class knows: a misspelt name is
silently ignored by pydantic-settings, so the check has to be made here.
"""

from __future__ import annotations

import importlib
import inspect

from persistence.settings import CommonSettings

# Modules that define pydantic-settings classes; the ones not written yet are skipped.
SETTINGS_MODULES = ("service.settings", "worker.settings")


def known_variables() -> set[str]:
    """Every environment variable name a torchport settings class reads."""
    names: set[str] = set()
    for module_name in SETTINGS_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name == module_name:
                continue
            raise
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, CommonSettings):
                names.update(cls.variables())
    return names
