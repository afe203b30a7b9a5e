"""Checks of an upload that need no code run: file types, UTF-8 source, a zip's limits.

A model zip is a checkpoint or code by the contract's rule (`schemas.model_zip`), read off
its directory; each gets its own size limits (docs/contract.md §1), the same numbers the
engine unpacks with. The directory itself is bounded in entries and bytes before it is
parsed, and parsed once: where each file lies is returned, for the submission to record.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from persistence.zip_index import ZipIndex
from schemas import ExportOptions, model_zip
from schemas.limits import (
    CHECKPOINT_ZIP_MAX_UNPACKED_BYTES,
    ZIP_MAX_ENTRIES,
    ZIP_MAX_UNPACKED_BYTES,
)
from service import archives
from service.errors import InvalidRequest, UploadTooLarge
from service.uploads import UploadedForm

__all__ = [
    "CALIBRATION_SUFFIXES",
    "INPUTS_SUFFIXES",
    "MODEL_SUFFIXES",
    "WEIGHTS_SUFFIXES",
    "validate_uploads",
]

MODEL_SUFFIXES = (".py", ".zip")
INPUTS_SUFFIXES = (".safetensors", ".pt", ".json")
WEIGHTS_SUFFIXES = (".safetensors", ".pt", ".pth")
"""`.pth` is a `torch.save` file like `.pt`: only the engine reads it, in the sandbox, with
`weights_only=True`; the API never opens it."""
CALIBRATION_SUFFIXES = (".safetensors", ".pt", ".json")


def _check_suffix(form: UploadedForm, field: str, allowed: tuple[str, ...]) -> None:
    upload = form.files.get(field)
    if upload is not None and Path(upload.filename).suffix.lower() not in allowed:
        raise InvalidRequest(
            f"{field} must be one of {', '.join(allowed)}",
            details={"field": field, "filename": upload.filename, "allowed": list(allowed)},
        )


def validate_uploads(
    form: UploadedForm,
    options: ExportOptions,
    *,
    max_model_bytes: int,
    max_directory_bytes: int = archives.MAX_ZIP_DIRECTORY_BYTES,
) -> ZipIndex | None:
    """Check what can be checked without running anything: types, encoding, zip limits.

    A checkpoint zip (`schemas.model_zip`) was received against the larger checkpoint
    limit; any other model is held to `max_model_bytes` here. A zip's central directory
    is held to `ZIP_MAX_ENTRIES` entries and `max_directory_bytes` before it is parsed.

    Blocking (reads the files): endpoints call it from a worker thread.

    Returns:
        Where each regular file of a zip model lies (`persistence.zip_index`); None for
        a `.py` model.

    Raises:
        InvalidRequest: a wrong file type, non-UTF-8 source, a broken zip, a zip over a
            limit (`details.reason` `zip_too_large`) or without the entry file.
        UploadTooLarge: a model that is not a checkpoint over `max_model_bytes`
            (`details.limit` = `model`).
    """
    model = form.files["model"]
    if form.source is None:
        _check_suffix(form, "model", MODEL_SUFFIXES)
    _check_suffix(form, "inputs", INPUTS_SUFFIXES)
    _check_suffix(form, "weights", WEIGHTS_SUFFIXES)
    _check_suffix(form, "calibration", CALIBRATION_SUFFIXES)
    _check_calibration_scheme(form, options)
    if form.source is not None:  # a reference's manifest, made by the API (`references`)
        return None
    if model.size == 0:
        raise InvalidRequest("the `model` file is empty", details={"field": "model"})
    if model.filename.lower().endswith(".py"):
        _check_model_size(model.size, max_model_bytes)
        try:
            model.path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                "model source must be UTF-8",
                details={"field": "model", "reason": "not_utf8", "offset": exc.start},
            ) from exc
        return None
    return _validate_zip(
        model.path, model.size, options.entry, max_model_bytes, max_directory_bytes
    )


def _check_calibration_scheme(form: UploadedForm, options: ExportOptions) -> None:
    """Calibration inputs are what static `int8` observes; no other scheme reads them."""
    scheme = options.quantize.scheme
    if "calibration" in form.files and scheme != "int8":
        raise InvalidRequest(
            f"a calibration file is read only by quantize.scheme int8, not {scheme}",
            hint='Set options {"quantize": {"scheme": "int8"}}, or leave the calibration '
            "file out (int8_dynamic and the weight-only schemes need none).",
            details={"field": "calibration", "reason": "calibration_unused", "scheme": scheme},
        )


def _check_model_size(size: int, max_model_bytes: int) -> None:
    if size > max_model_bytes:
        raise UploadTooLarge(
            f"model is over its limit of {max_model_bytes} bytes (it is not a checkpoint zip)",
            details={"field": "model", "limit_bytes": max_model_bytes, "limit": "model"},
        )


def _validate_zip(
    path: Path, size: int, entry: str | None, max_model_bytes: int, max_directory_bytes: int
) -> ZipIndex:
    """The contract's zip limits (`schemas.limits`), the ones the engine unpacks with, so
    a zip taken here is never refused for its size later: a checkpoint's, or code's."""
    try:
        # Counted from the end record before zipfile parses every entry (zip bombs of
        # entries: 312k of them fit in 16 MiB and take seconds to parse), and the
        # directory's bytes told by it before they are read (10,000 entries with 64 KiB
        # names or comments: 2 GB, read whole by zipfile).
        entries = archives.count_entries(path, ZIP_MAX_ENTRIES, max_bytes=max_directory_bytes)
        if entries > ZIP_MAX_ENTRIES:
            raise _zip_too_large(ZIP_MAX_UNPACKED_BYTES, "model")
        with zipfile.ZipFile(path) as archive:
            members = archive.infolist()
        index = archives.locate(members, size)
    except archives.DirectoryTooLarge as exc:
        raise InvalidRequest(
            "model zip's central directory is too large",
            details={
                "field": "model",
                "reason": "zip_too_large",
                "max_entries": ZIP_MAX_ENTRIES,
                "max_directory_bytes": exc.limit,
                "directory_bytes": exc.size,
                "limit": "directory",
            },
        ) from exc
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise InvalidRequest(
            "model is not a readable zip", details={"field": "model", "reason": "bad_zip"}
        ) from exc
    files = model_zip.unpacked_files(m.filename for m in members)
    if model_zip.checkpoint_base(files, entry) is not None:
        max_unpacked, limit = CHECKPOINT_ZIP_MAX_UNPACKED_BYTES, "checkpoint"
    else:
        _check_model_size(size, max_model_bytes)
        max_unpacked, limit = ZIP_MAX_UNPACKED_BYTES, "model"
    if len(members) > ZIP_MAX_ENTRIES or sum(m.file_size for m in members) > max_unpacked:
        raise _zip_too_large(max_unpacked, limit)
    names = {m.filename for m in members}
    if any(name.startswith("/") or ".." in Path(name).parts for name in names):
        raise InvalidRequest(
            "model zip has paths outside itself", details={"field": "model", "reason": "zip_slip"}
        )
    if entry is None:
        if model_zip.adapter_only_base(files, entry) is not None:
            raise InvalidRequest(
                "model zip holds a PEFT adapter but not the base checkpoint it adapts",
                hint="torchport does not download models: zip the base's save_pretrained files "
                "(config.json and weights) with the adapter in a sub-folder beside them.",
                details={"field": "model", "reason": "adapter_without_base"},
            )
        if limit == "model" and not any(name.endswith(".py") for name in names):
            raise InvalidRequest(
                "model zip holds no .py file and no checkpoint config.json",
                details={"field": "options.entry", "reason": "no_model"},
            )
    elif entry not in names:
        raise InvalidRequest(
            f"entry {entry!r} is not in the zip",
            details={"field": "options.entry", "entry": entry},
        )
    return index


def _zip_too_large(max_unpacked: int, limit: str) -> InvalidRequest:
    return InvalidRequest(
        "model zip unpacks to too much",
        details={
            "field": "model",
            "reason": "zip_too_large",
            "max_entries": ZIP_MAX_ENTRIES,
            "max_unpacked_bytes": max_unpacked,
            "limit": limit,
        },
    )
