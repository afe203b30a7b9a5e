"""The LOAD stage: uploaded source → imported module → `nn.Module` + example inputs.

Steps, each failing with its own contract code (stage `loading`):
0. check the options' `requires` against the installed distributions —
   `environment_mismatch`;
1. place the source under `workdir/src` (a `.py` is copied, a `.zip` is unpacked
   with path, symlink and size checks) — `invalid_request`;
2. import the entry module under a real name in `sys.modules` (dynamo's strict
   tracing looks modules up there) — `model_import_failed`;
3. resolve the model symbol: instance, class, function of tensors or `get_model()`
   — `model_not_found`;
4. example inputs from the inputs file or `example_args` — `invalid_inputs`;
5. weights — `weights_mismatch`; device placement — `invalid_request`;
6. one eager reference run on a deep copy — `eager_run_failed`.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import itertools
import os
import re
import shutil
import stat
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import torch
from torch.utils._pytree import tree_map_only

from engine import libraries as library_index
from engine.errors import (
    EagerRunFailed,
    EnvironmentMismatch,
    InvalidInputs,
    InvalidRequest,
    ModelImportFailed,
    ModelNotFound,
)
from engine.inputs import normalize_inputs, read_inputs
from engine.model import LoadedModel, Upload
from engine.source_map import SourceMap
from engine.weights import load_weights
from schemas import ExportOptions, SourceLocation

STAGE = "loading"

MAX_ZIP_FILES = 10_000
"""Most entries a model zip may hold."""
MAX_ZIP_BYTES = 256 * 1024 * 1024
"""Most bytes a model zip may unpack to (weights travel separately)."""

_COPY_CHUNK = 1024 * 1024
_MISSING = object()
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_IGNORED_ZIP_DIRS = frozenset({"__MACOSX"})

# Upload roots this process has imported from, and the sys.path entries added for
# them. A later load evicts their modules and paths so names never resolve to an
# earlier upload's code (one job per process in production; many in tests).
_upload_roots: list[str] = []
_added_paths: list[str] = []
_module_numbers = itertools.count(1)
_unique_names: set[str] = set()
_modules_before_uploads: set[str] = set()
"""sys.modules as it was before the first upload: only modules added since are scanned."""


def load(
    upload: Upload,
    options: ExportOptions,
    workdir: Path,
    *,
    reference: bool = True,
    libraries: dict[str, str] | None = None,
) -> LoadedModel:
    """Load the uploaded model, its example inputs and weights, and run it once eagerly.

    With `reference=False` the eager run is left to the caller (`run_eager`), which
    does it only when something needs it: verification, or explaining a failure.

    Args:
        upload: paths of the uploaded model (`.py` or `.zip`), inputs and weights.
        options: the export options (`symbol`, `entry`, `device` are used here).
        workdir: the job's scratch directory; the source goes to `workdir/src`.
        libraries: filled in, even when loading fails, with the third-party
            distributions (and versions) the upload imported while it was imported and
            its model built, and torch (`libraries.imported_libraries`).

    Returns:
        The pristine module (never run), its inputs on the chosen device, the eager
        reference outputs and the buffers of the reference copy after its run.

    Raises:
        ExportError: with stage `loading` and one of the codes `invalid_request`,
            `environment_mismatch`, `model_import_failed`, `model_not_found`, `invalid_inputs`,
            `weights_mismatch`, `eager_run_failed`.
    """
    if options.device == "cuda" and not torch.cuda.is_available():
        raise InvalidRequest(
            "The options ask for device cuda, but this worker has no GPU.",
            hint="No CUDA device is present here: submit with device cpu, or to a GPU worker.",
            stage=STAGE,
            details={"device": "cuda"},
        )
    check_requires(options.requires)
    root = workdir / "src"
    root.mkdir(parents=True, exist_ok=True)
    source_map = SourceMap(root)
    entry = place_source(upload.model, root, options.entry)
    before = set(sys.modules)
    module: ModuleType | None = None
    try:
        module = import_entry(root, entry, source_map)
        model = resolve_model(module, options.symbol, source_map)
    finally:
        if libraries is not None:
            libraries.update(
                library_index.imported_libraries(
                    before, modules=[module] if module else [], upload_root=root
                )
            )
    if upload.inputs is not None:
        args, kwargs = read_inputs(upload.inputs)
    else:
        args, kwargs = _module_inputs(module, model)
    if upload.weights is not None:
        load_weights(model, upload.weights)
    if options.device == "cuda":
        model.to("cuda")
        args, kwargs = tree_map_only(torch.Tensor, lambda t: t.to("cuda"), (args, kwargs))
    outputs, buffers = run_eager(model, args, kwargs, source_map) if reference else (None, {})
    return LoadedModel(
        module=model,
        args=args,
        kwargs=kwargs,
        source_map=source_map,
        entry=entry,
        module_name=module.__name__,
        module_dynamic_shapes=getattr(module, "dynamic_shapes", None),
        eager_outputs=outputs,
        eager_buffers=buffers,
        device=options.device,
    )


def check_requires(requires: list[str]) -> None:
    """Raise `environment_mismatch` unless every requirement of the options is met here.

    Raises:
        EnvironmentMismatch: details `requirements` (each with `requirement`, `name`,
            `installed` — the version, or null — and `met`) and `unmet`.
    """
    if not requires:
        return
    checks = library_index.check_requirements(requires)
    unmet = [check for check in checks if not check.met]
    if not unmet:
        return
    described = ", ".join(
        f"{check.requirement} (installed: {check.installed or 'none'})" for check in unmet
    )
    raise EnvironmentMismatch(
        f"This worker does not meet the upload's requirements: {described}.",
        stage=STAGE,
        details={
            "requirements": [check.as_details() for check in checks],
            "unmet": [check.requirement for check in unmet],
        },
    )


# --- source --------------------------------------------------------------------------


def place_source(model: Path, root: Path, entry: str | None) -> str:
    """Copy or unpack the uploaded model under `root`; return the entry's relative path."""
    try:
        is_zip = model.suffix.lower() == ".zip" or (
            model.suffix.lower() != ".py" and zipfile.is_zipfile(model)
        )
        if not is_zip:
            name = model.name if model.suffix.lower() == ".py" else "model.py"
            shutil.copyfile(model, root / name)
            return name
    except OSError as exc:
        raise InvalidRequest(
            "The uploaded model file cannot be read.",
            stage=STAGE,
            details={"model": model.name, "exception": type(exc).__name__},
        ) from exc
    files = unpack_zip(model, root)
    return choose_entry(files, entry)


def unpack_zip(
    archive: Path, dest: Path, *, max_files: int | None = None, max_bytes: int | None = None
) -> list[str]:
    """Unpack `archive` into `dest`, refusing anything that could leave `dest`.

    Refused (as `InvalidRequest`, details `reason`): entries with `..`, absolute or
    drive paths (`outside_archive`), symlinks (`symlink`), device or pipe entries
    (`special_file`), more than `max_files` entries (`too_many_files`) or more than
    `max_bytes` unpacked (`too_large`, counted on the bytes actually written, so a
    lying header does not help), and unreadable archives (`bad_zip`).

    Returns:
        The relative POSIX paths of the regular files unpacked, sorted.
    """
    max_files = MAX_ZIP_FILES if max_files is None else max_files
    max_bytes = MAX_ZIP_BYTES if max_bytes is None else max_bytes
    dest_resolved = dest.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = [i for i in zf.infolist() if _zip_parts(i.filename)[:1] != ["__MACOSX"]]
            if len(infos) > max_files:
                raise _zip_refused("too_many_files", files=len(infos), max_files=max_files)
            declared = sum(i.file_size for i in infos)
            if declared > max_bytes:
                raise _zip_refused("too_large", bytes=declared, max_bytes=max_bytes)
            written = 0
            files: list[str] = []
            for info in infos:
                parts = _check_zip_entry(info)
                if not parts:
                    continue
                target = dest.joinpath(*parts)
                if not target.resolve().is_relative_to(dest_resolved):
                    raise _zip_refused("outside_archive", zip_entry=info.filename)
                if info.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, target.open("wb") as out:
                    while chunk := src.read(_COPY_CHUNK):
                        written += len(chunk)
                        if written > max_bytes:
                            raise _zip_refused("too_large", bytes=written, max_bytes=max_bytes)
                        out.write(chunk)
                files.append("/".join(parts))
    except InvalidRequest:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, OSError, EOFError) as exc:
        raise _zip_refused("bad_zip", exception=type(exc).__name__) from exc
    return sorted(set(files))


def _zip_parts(name: str) -> list[str]:
    return [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]


def _check_zip_entry(info: zipfile.ZipInfo) -> list[str]:
    name = info.filename
    parts = _zip_parts(name)
    if (
        name.startswith(("/", "\\"))
        or ".." in parts
        or "\x00" in name
        or (parts and re.match(r"^[A-Za-z]:", parts[0]))
    ):
        raise _zip_refused("outside_archive", zip_entry=name)
    mode = info.external_attr >> 16
    if stat.S_ISLNK(mode):
        raise _zip_refused("symlink", zip_entry=name)
    if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
        raise _zip_refused("special_file", zip_entry=name)
    return parts


def _zip_refused(reason: str, **details: Any) -> InvalidRequest:
    return InvalidRequest(
        "The model zip was refused.",
        hint="Upload a plain zip of your source files: relative paths, no links, small size.",
        stage=STAGE,
        details={"reason": reason, **details},
    )


def choose_entry(files: list[str], entry: str | None) -> str:
    """The entry file among the unpacked `files`.

    `entry` from the options wins. Otherwise a top-level `model.py`, or the only
    top-level `.py`; a zip holding a single folder is looked into the same way.
    """
    sources = [f for f in files if f.endswith(".py")]
    if entry is not None:
        wanted = PurePosixPath(entry.replace("\\", "/")).as_posix().removeprefix("./")
        if wanted in sources:
            return wanted
        raise InvalidRequest(
            "The entry named in the options is not a .py file of the zip.",
            stage=STAGE,
            details={"entry": entry, "available": sources[:50]},
        )
    prefix = ""
    tops = {f.split("/", 1)[0] for f in files}
    if not any("/" not in f for f in sources) and len(tops) == 1 and "/" in files[0]:
        prefix = next(iter(tops)) + "/"
    level = [
        f
        for f in sources
        if f.startswith(prefix) and "/" not in f[len(prefix) :] and not f.endswith("__init__.py")
    ]
    if f"{prefix}model.py" in level:
        return f"{prefix}model.py"
    if len(level) == 1:
        return level[0]
    raise InvalidRequest(
        "The zip has no single entry file; name one with the `entry` option.",
        stage=STAGE,
        details={"entry": None, "candidates": sources[:50]},
    )


# --- import --------------------------------------------------------------------------


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
    hint = None
    if isinstance(exc, ModuleNotFoundError):
        details["missing_module"] = exc.name
        hint = _missing_module_hint(exc.name, source_map.root)
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


# --- model ---------------------------------------------------------------------------


def resolve_model(module: ModuleType, symbol: str, source_map: SourceMap) -> torch.nn.Module:
    """The `nn.Module` named by `symbol` in `module`.

    `symbol` may name an `nn.Module` instance, an `nn.Module` subclass (instantiated
    with no arguments), a function of tensors (wrapped by `wrap_function`) or a
    factory `get_model()`; when `symbol` is `model` and there is none, `get_model()`
    is used.

    Raises:
        ModelNotFound: the symbol is missing, not exportable, or its construction
            raised (details `symbol`, `available`, and `exception` or `got`).
    """
    obj: Any = getattr(module, symbol, _MISSING)
    factory = symbol == "get_model"
    if obj is _MISSING and symbol == "model" and callable(getattr(module, "get_model", None)):
        obj, factory = module.get_model, True
    if obj is _MISSING:
        raise ModelNotFound(
            f"The entry module defines no `{symbol}`"
            + (" and no `get_model()`." if symbol == "model" else "."),
            stage=STAGE,
            details={"symbol": symbol, "available": model_like_names(module)},
        )
    is_module_class = inspect.isclass(obj) and issubclass(obj, torch.nn.Module)
    if is_module_class or (factory and callable(obj) and not inspect.isclass(obj)):
        obj = _construct(obj, symbol, source_map, module)
    if isinstance(obj, torch.nn.Module):
        return obj
    if callable(obj) and not inspect.isclass(obj):
        return wrap_function(obj)
    raise ModelNotFound(
        f"`{symbol}` is a {type(obj).__name__}, not an nn.Module, a module class or a function.",
        stage=STAGE,
        location=_definition_location(obj, source_map),
        details={
            "symbol": symbol,
            "got": type(obj).__name__,
            "available": model_like_names(module),
        },
    )


def _construct(
    factory: Callable[[], Any], symbol: str, source_map: SourceMap, module: ModuleType
) -> Any:
    try:
        return factory()
    except Exception as exc:
        raise ModelNotFound(
            f"Constructing `{symbol}` with no arguments failed: {type(exc).__name__}: "
            f"{source_map.scrub(str(exc))}",
            hint="The model class must be constructible with no arguments, or define "
            "`get_model()` returning an instance.",
            stage=STAGE,
            location=source_map.from_exception(exc) or _definition_location(factory, source_map),
            details={
                "symbol": symbol,
                "exception": type(exc).__name__,
                "available": model_like_names(module),
            },
        ) from exc


def _definition_location(obj: Any, source_map: SourceMap) -> SourceLocation | None:
    try:
        filename = inspect.getsourcefile(obj)
        _, line = inspect.getsourcelines(obj)
    except (TypeError, OSError):
        return None
    return source_map.location(filename, max(line, 1)) if filename else None


def model_like_names(module: ModuleType) -> list[str]:
    """Public module-level names that could be a model: modules, module classes and
    functions defined in `module`."""
    found = []
    for name, value in vars(module).items():
        if name.startswith("_"):
            continue
        defined_here = getattr(value, "__module__", None) == module.__name__
        if (
            isinstance(value, torch.nn.Module)
            or (inspect.isclass(value) and issubclass(value, torch.nn.Module) and defined_here)
            or (inspect.isfunction(value) and defined_here)
        ):
            found.append(name)
    return sorted(found)[:50]


class FunctionModule(torch.nn.Module):
    """An `nn.Module` whose forward calls a plain function of tensors.

    `wrap_function` makes a subclass per function whose `forward` carries the
    function's signature, so arguments keep their names (dynamic_shapes keyed by
    argument name, input names in the exported graph).
    """

    def __init__(self, function: Callable[..., Any]) -> None:
        super().__init__()
        self.function = function

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function."""
        return self.function(*args, **kwargs)


def wrap_function(function: Callable[..., Any]) -> torch.nn.Module:
    """Wrap a function of tensors in an `nn.Module` with the function's signature."""

    def forward(self: FunctionModule, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[self_param, *signature.parameters.values()]
        )
    name = getattr(function, "__name__", "function")
    cls = type(
        name if _IDENTIFIER.match(name) else "function",
        (FunctionModule,),
        {"forward": forward, "__module__": getattr(function, "__module__", __name__)},
    )
    module: torch.nn.Module = cls(function)
    return module


# --- inputs and eager run ------------------------------------------------------------


def _module_inputs(
    module: ModuleType, model: torch.nn.Module
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    args = getattr(module, "example_args", _MISSING)
    if args is _MISSING:
        if _required_parameters(model):
            raise InvalidInputs(
                "No example inputs: the module has no `example_args` and no inputs file "
                "was uploaded.",
                hint="Define `example_args` in the module or upload an inputs file.",
                stage=STAGE,
                details={"source": "module", "missing": "example_args"},
            )
        args = ()
    return normalize_inputs(args, getattr(module, "example_kwargs", None), source="module")


def _required_parameters(model: torch.nn.Module) -> list[str]:
    try:
        parameters = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return ["?"]
    return [
        p.name
        for p in parameters
        if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]


def run_eager(
    module: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    source_map: SourceMap,
) -> tuple[Any, dict[str, torch.Tensor]]:
    """Run a deep copy of `module` once on deep copies of the inputs, under no_grad.

    `module` and the inputs are left untouched, buffers included. A module that
    cannot be deep-copied is run itself, and its parameters and buffers are restored
    afterwards.

    Returns:
        The outputs, and the reference copy's buffers after the run.

    Raises:
        EagerRunFailed: the forward raised (location: the innermost user frame;
            details `exception`).
    """
    try:
        reference = copy.deepcopy(module)
        saved = None
    except Exception:
        reference = module
        saved = _snapshot(module)
    try:
        run_args, run_kwargs = copy.deepcopy((args, kwargs))
    except Exception:
        # e.g. non-leaf tensors, which refuse deepcopy
        run_args, run_kwargs = tree_map_only(
            torch.Tensor, lambda t: t.detach().clone(), (args, kwargs)
        )
    try:
        with torch.no_grad():
            outputs = reference(*run_args, **run_kwargs)
        buffers = {name: b for name, b in reference.named_buffers()}
        if saved is not None:
            buffers = {name: b.clone() for name, b in buffers.items()}
    except Exception as exc:
        raise EagerRunFailed(
            f"Running the model on its example inputs failed: {type(exc).__name__}: "
            f"{source_map.scrub(str(exc))}",
            stage=STAGE,
            location=source_map.from_exception(exc),
            details={"exception": type(exc).__name__},
        ) from exc
    finally:
        if saved is not None:
            _restore(module, saved)
    return outputs, buffers


_Snapshot = list[tuple[torch.nn.Module, str, str, torch.Tensor | None, torch.Tensor | None]]


def _snapshot(module: torch.nn.Module) -> _Snapshot:
    """The tensor objects of every parameter and buffer, with a copy of their values."""
    saved: _Snapshot = []
    for owner in module.modules():
        for kind in ("_parameters", "_buffers"):
            for name, tensor in getattr(owner, kind).items():
                value = None if tensor is None else tensor.detach().clone()
                saved.append((owner, kind, name, tensor, value))
    return saved


def _restore(module: torch.nn.Module, saved: _Snapshot) -> None:
    with torch.no_grad():
        for owner, kind, name, tensor, value in saved:
            getattr(owner, kind)[name] = tensor
            if tensor is not None and value is not None:
                tensor.copy_(value)
