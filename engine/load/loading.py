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
5. weights — `weights_mismatch`; the mode option `training` asks for (eval by default,
   `engine.load.training_mode`) — `invalid_request`; device placement — `invalid_request`;
6. one eager reference run on a deep copy — `eager_run_failed`.

The steps live in their own modules, re-exported here: `engine.load.upload_import` (2),
`engine.load.model_resolution` (3) and `engine.load.eager` (the module's own example inputs of 4,
and 6); this module places the source (1) and runs the stage.
"""

from __future__ import annotations

import re
import shutil
import stat
import sys
import zipfile
from pathlib import Path, PurePosixPath
from types import ModuleType
from typing import Any

import torch

from engine.diagnostics.source_map import SourceMap
from engine.environment import libraries as library_index
from engine.errors import EnvironmentMismatch, InvalidRequest
from engine.load import checkpoint
from engine.load.checkpoint import in_archive
from engine.load.eager import module_inputs, prepare, run_eager
from engine.load.inputs import read_inputs
from engine.load.model import LoadedModel, Upload
from engine.load.model_resolution import (
    FunctionModule,
    model_like_names,
    resolve_model,
    wrap_function,
)
from engine.load.upload_import import import_entry
from schemas import ExportOptions
from schemas.limits import (
    CHECKPOINT_ZIP_MAX_UNPACKED_BYTES,
    ZIP_MAX_ENTRIES,
    ZIP_MAX_UNPACKED_BYTES,
)
from schemas.model_zip import ADAPTER_WEIGHTS, checkpoint_base, unpacked_files

__all__ = [
    "MAX_CHECKPOINT_ZIP_BYTES",
    "MAX_ZIP_BYTES",
    "MAX_ZIP_FILES",
    "STAGE",
    "FunctionModule",
    "check_requires",
    "choose_entry",
    "import_entry",
    "load",
    "model_like_names",
    "place_files",
    "place_source",
    "resolve_model",
    "run_eager",
    "unpack_zip",
    "wrap_function",
]

STAGE = "loading"

MAX_ZIP_FILES = ZIP_MAX_ENTRIES
"""Most entries a model zip may hold (the contract's, `schemas.limits`)."""
MAX_ZIP_BYTES = ZIP_MAX_UNPACKED_BYTES
"""Most bytes a model zip of code may unpack to (the contract's, `schemas.limits`)."""
MAX_CHECKPOINT_ZIP_BYTES = CHECKPOINT_ZIP_MAX_UNPACKED_BYTES
"""Most bytes a checkpoint zip may unpack to (the contract's, `schemas.limits`)."""

_COPY_CHUNK = 1024 * 1024
_KERNEL_COPY_MIN = 1024 * 1024
"""Stored members from this size on are copied by the kernel (`_copy_stored`)."""


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
        options: the export options (`symbol`, `entry`, `device`, `weights`, `training`
            are used here).
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
    files, unpacked = place_files(upload.model, root, options.entry)
    base = checkpoint.checkpoint_base(files, options.entry) if unpacked else None
    adapter_only = checkpoint.adapter_only_base(files, options.entry) if unpacked else None
    if adapter_only is not None:
        checkpoint.refuse_adapter_only(root / adapter_only)
    if base is not None:
        return checkpoint.load_checkpoint(
            upload,
            options,
            root / base,
            source_map,
            reference=reference,
            libraries=libraries,
        )
    entry = choose_entry(files, options.entry) if unpacked else files[0]
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
        args, kwargs = module_inputs(module, model)
    prepared = prepare(
        model,
        args,
        kwargs,
        weights=upload.weights,
        options=options,
        source_map=source_map,
        reference=reference,
    )
    return LoadedModel(
        module=model,
        args=prepared.args,
        kwargs=prepared.kwargs,
        source_map=source_map,
        entry=entry,
        module_name=module.__name__,
        module_dynamic_shapes=getattr(module, "dynamic_shapes", None),
        eager_outputs=prepared.outputs,
        eager_buffers=prepared.buffers,
        device=options.device,
        weights=prepared.weights,
        warnings=prepared.warnings,
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
    files, unpacked = place_files(model, root, entry)
    return choose_entry(files, entry) if unpacked else files[0]


def place_files(model: Path, root: Path, entry: str | None = None) -> tuple[list[str], bool]:
    """Copy the uploaded source file under `root`, or unpack the uploaded zip there (a
    checkpoint zip, as `entry` and its names say, within the checkpoint's bound).

    Returns:
        The relative paths of the files placed, and whether they came from a zip.
    """
    try:
        is_zip = model.suffix.lower() == ".zip" or (
            model.suffix.lower() != ".py" and zipfile.is_zipfile(model)
        )
        if not is_zip:
            name = model.name if model.suffix.lower() == ".py" else "model.py"
            shutil.copyfile(model, root / name)
            return [name], False
    except OSError as exc:
        raise InvalidRequest(
            "The uploaded model file cannot be read.",
            stage=STAGE,
            details={"model": model.name, "exception": type(exc).__name__},
        ) from exc
    return unpack_zip(model, root, entry=entry), True


def unpack_zip(
    archive: Path,
    dest: Path,
    *,
    entry: str | None = None,
    max_files: int | None = None,
    max_bytes: int | None = None,
) -> list[str]:
    """Unpack `archive` into `dest`, refusing anything that could leave `dest`.

    Refused (as `InvalidRequest`, details `reason`): entries with `..`, absolute or
    drive paths (`outside_archive`), symlinks (`symlink`), device or pipe entries
    (`special_file`), more than `max_files` entries (`too_many_files`) or more than
    `max_bytes` unpacked (`too_large`, counted on the bytes actually written, so a
    lying header does not help; details `limit`: `checkpoint` when the names make a
    checkpoint, whose default bound is `MAX_CHECKPOINT_ZIP_BYTES`, else `model`), and
    unreadable archives (`bad_zip`). Each member is copied in chunks of 1 MiB, so a
    stored multi-GB safetensors file never sits in memory.

    Returns:
        The relative POSIX paths of the regular files unpacked, sorted.
    """
    max_files = MAX_ZIP_FILES if max_files is None else max_files
    dest_resolved = dest.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            infos = [i for i in zf.infolist() if _zip_parts(i.filename)[:1] != ["__MACOSX"]]
            if len(infos) > max_files:
                raise _zip_refused("too_many_files", files=len(infos), max_files=max_files)
            names = unpacked_files(i.filename for i in infos)
            base = checkpoint_base(names, entry)
            limit = "checkpoint" if base is not None else "model"
            if max_bytes is None:
                max_bytes = MAX_CHECKPOINT_ZIP_BYTES if limit == "checkpoint" else MAX_ZIP_BYTES
            declared = sum(i.file_size for i in infos)
            if declared > max_bytes:
                raise _zip_refused("too_large", bytes=declared, max_bytes=max_bytes, limit=limit)
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
                kept = _kept(archive, info, parts, base)
                if kept is not None and info.file_size <= max_bytes - written:
                    in_archive.keep(target, kept)  # read in place: engine/load/checkpoint
                    written += info.file_size
                    files.append("/".join(parts))
                    continue
                copied = _copy_stored(archive, info, target, max_bytes - written)
                if copied is not None:
                    written += copied
                    files.append("/".join(parts))
                    continue
                with zf.open(info) as src, target.open("wb") as out:
                    while chunk := src.read(_COPY_CHUNK):
                        written += len(chunk)
                        if written > max_bytes:
                            raise _zip_refused(
                                "too_large", bytes=written, max_bytes=max_bytes, limit=limit
                            )
                        out.write(chunk)
                files.append("/".join(parts))
    except InvalidRequest:
        raise
    except (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, OSError, EOFError) as exc:
        raise _zip_refused("bad_zip", exception=type(exc).__name__) from exc
    return sorted(set(files))


def _kept(
    archive: Path, info: zipfile.ZipInfo, parts: list[str], base: str | None
) -> in_archive.Kept | None:
    """A checkpoint's base-level safetensors weights (not an adapter's) that can be read
    where they lie in the zip (`in_archive.readable`); None for anything else."""
    name = parts[-1]
    if base is None or "/".join(parts) != base + name or not name.endswith(".safetensors"):
        return None
    if name == ADAPTER_WEIGHTS:
        return None
    return in_archive.readable(archive, info)


def _copy_stored(archive: Path, info: zipfile.ZipInfo, target: Path, room: int) -> int | None:
    """Copy a large stored (uncompressed) member in the kernel (`copy_file_range`: a
    checkpoint's 937 MB of safetensors in 1.1 s instead of 3.0 s through `zipfile`, which
    copies through Python and checks the CRC); the bytes copied, or None to leave it to
    `zipfile` (compressed, small, a header that does not add up, or a kernel or
    sandbox that refuses the call). Exactly the member's declared size is copied, from
    where its local header says its data starts, and only when that lies inside the
    archive; over `room` bytes it is refused as `zipfile` would be."""
    size = info.file_size
    if size < _KERNEL_COPY_MIN:
        return None
    with archive.open("rb") as src:
        start = in_archive.stored_start(src, info)
        if start is None:
            return None
        if size > room:
            return None  # zipfile's copy refuses it, with the count it reached
        try:
            with target.open("wb") as out:
                in_archive.copy_range(src.fileno(), out.fileno(), start, size)
        except OSError:
            target.unlink(missing_ok=True)
            return None
    return size


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
    if not sources:
        raise InvalidRequest(
            "The zip holds neither Python source nor a checkpoint's config.json.",
            hint="Zip your model code (with a model.py), or a whole `save_pretrained` "
            "directory (config.json and its *.safetensors).",
            stage=STAGE,
            details={"entry": None, "candidates": [], "reason": "no_model"},
        )
    raise InvalidRequest(
        "The zip has no single entry file; name one with the `entry` option.",
        stage=STAGE,
        details={"entry": None, "candidates": sources[:50]},
    )
