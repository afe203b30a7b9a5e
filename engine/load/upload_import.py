"""Importing the upload's entry module (LOAD stage, step 2).

The entry is imported under a real name in `sys.modules` (dynamo's strict tracing looks
modules up there): by its dotted name inside packages, so relative imports work, or
under a name unique in this process. Each import first evicts the modules and
`sys.path` entries of earlier uploads, so names never resolve to an earlier upload's
code (one job per process in production; many in tests).
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.diagnostics.source_map import SourceMap
from engine.errors import ModelImportFailed
from schemas import SourceLocation

__all__ = ["import_entry"]

STAGE = "loading"

_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")

# Upload roots this process has imported from, and the sys.path entries added for
# them. A later load evicts their modules and paths so names never resolve to an
# earlier upload's code (one job per process in production; many in tests).
_upload_roots: list[str] = []
_added_paths: list[str] = []
_module_numbers = itertools.count(1)
_unique_names: set[str] = set()
_modules_before_uploads: set[str] = set()
"""sys.modules as it was before the first upload: only modules added since are scanned."""


def import_entry(root: Path, entry: str, source_map: SourceMap) -> ModuleType:
    """Import `root/entry` and register it in `sys.modules`.

    An entry inside packages (`pkg/net.py` with `pkg/__init__.py`) is imported by its
    dotted name (`pkg.net`), so relative imports work; any other entry gets a name
    unique in this process. The package base, the entry's folder and `root` go first
    on `sys.path`, so absolute and plain sibling imports work too.

    Raises:
        ModelImportFailed: the module raised on import (location in the user's file;
            details `exception`, and `missing_module` for a missing package).
    """
    path = root / entry
    package_dirs: list[str] = []
    base = path.parent
    while base != root and _IDENTIFIER.match(base.name) and (base / "__init__.py").is_file():
        package_dirs.insert(0, base.name)
        base = base.parent
    _forget_previous_uploads()
    search = list(dict.fromkeys(str(p) for p in (base, path.parent, root)))
    for folder in reversed(search):
        sys.path.insert(0, folder)
    _added_paths.extend(search)
    _upload_roots.extend({str(root) + os.sep, str(root.resolve()) + os.sep})
    importlib.invalidate_caches()

    if package_dirs:
        dotted = ".".join(package_dirs + ([] if path.stem == "__init__" else [path.stem]))
        top = package_dirs[0]
        if top in sys.modules:
            raise ModelImportFailed(
                f"The uploaded package `{top}` has the name of a module already loaded here.",
                hint=f"Rename the package `{top}` in the zip.",
                stage=STAGE,
                details={"exception": "ImportError", "shadowed_module": top},
            )
        try:
            return importlib.import_module(dotted)
        except (Exception, SystemExit) as exc:
            _forget_previous_uploads()
            raise _import_failed(exc, entry, source_map) from exc

    stem = re.sub(r"\W", "_", path.stem)
    name = f"user_upload_{next(_module_numbers)}_{stem}"
    _unique_names.add(name)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelImportFailed(
            "The entry file cannot be imported as a Python module.",
            stage=STAGE,
            details={"exception": "ImportError", "entry": entry},
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(name, None)
        raise _import_failed(exc, entry, source_map) from exc
    return module


def _forget_previous_uploads() -> None:
    """Drop the sys.path entries and modules of earlier uploads.

    Entry modules with generated unique names stay registered: a model loaded earlier
    in this process can still be traced strictly, and no import can reach them by name.
    """
    for added in _added_paths:
        if added in sys.path:
            sys.path.remove(added)
    _added_paths.clear()
    if not _modules_before_uploads:
        _modules_before_uploads.update(sys.modules)
    for key in set(sys.modules) - _modules_before_uploads - _unique_names:
        if _from_upload(sys.modules.get(key)):
            del sys.modules[key]


def _from_upload(module: ModuleType | None) -> bool:
    if not _upload_roots:
        return False
    prefixes = tuple(_upload_roots)
    locations: list[Any] = [getattr(module, "__file__", None)]
    paths: Any = getattr(module, "__path__", None)
    # torch registers pseudo-modules whose __path__ is not a list of folders
    if isinstance(paths, list) or type(paths).__name__ == "_NamespacePath":
        locations.extend(paths)
    return any(isinstance(loc, str) and loc.startswith(prefixes) for loc in locations)


def _import_failed(exc: BaseException, entry: str, source_map: SourceMap) -> ModelImportFailed:
    location: SourceLocation | None = None
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        location = source_map.location(exc.filename, exc.lineno)
        if location is not None and location.code is None and exc.text:
            location = location.model_copy(update={"code": exc.text.strip() or None})
    if location is None:
        location = source_map.from_exception(exc)
    details: dict[str, Any] = {"exception": type(exc).__name__}
    where = f"{location.file}:{location.line}" if location is not None else entry
    if isinstance(exc, ModuleNotFoundError):
        details["missing_module"] = exc.name
        hint = _missing_module_hint(exc.name, source_map.root)
    elif isinstance(exc, ImportError):
        # `from pkg import name` where the installed pkg has no such name: a version
        # question, or a typo; only here may installing something be the fix
        if exc.name:
            details["module"] = exc.name
        module = f"`{exc.name}`" if exc.name else "the package it imports"
        hint = (
            f"The import at {where} failed: fix it, or install a version of {module} that "
            "provides what it imports (see what the workers have with `torchport env`, and "
            "name the version in `requires`)."
        )
    elif isinstance(exc, SyntaxError):
        hint = f"Fix the {type(exc).__name__} at {where}: the file is not valid Python."
    else:
        hint = f"Fix the code at {where}: it raised while the module was imported."
    return ModelImportFailed(
        f"Importing {entry} failed: {type(exc).__name__}: {source_map.scrub(str(exc))}",
        hint=hint,
        stage=STAGE,
        location=location,
        details=details,
    )


def _missing_module_hint(name: str | None, root: Path) -> str:
    top = (name or "").partition(".")[0]
    if top and ((root / top).is_dir() or (root / f"{top}.py").is_file()):
        return (
            f"The module `{name}` is not in the upload, though `{top}` is: add the missing "
            "file to the zip, or fix the import."
        )
    return (
        f"The module `{name}` is not installed on the workers and not in the upload. See "
        "what the workers have (the Environment page, GET /v1/environment or `torchport "
        "env`); name what the model needs in the `requires` option (e.g. "
        f'"{top or name}>=1.0") so a worker without it says so up front; or include the '
        "module in a zip, or remove the import."
    )
