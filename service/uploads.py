"""Streaming multipart parsing of `POST /v1/exports`: files go to disk as they arrive.

Each field has its own byte limit (`upload_too_large` names the field and, in `limit`, the
limit that applied); a `.zip` model may have a larger one, for a checkpoint, which the
caller narrows once it has read the zip's names. Nothing is read whole into memory except
the small text fields. Files are hashed while written.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import ClientDisconnect, Request

from schemas.job import UPLOAD_ROLES
from schemas.limits import CALLBACK_URL_MAX_LENGTH, CALLBACK_URL_PATTERN
from schemas.source import URL_MAX_LENGTH, CheckpointSource
from service.errors import InvalidRequest, UploadTooLarge

FILE_FIELDS = UPLOAD_ROLES
TEXT_FIELDS = ("options", "callback_url", "model_url")
MULTIPART_OVERHEAD = 64 * 1024
"""Bytes of boundaries and part headers allowed on top of the field limits."""

UPLOAD_BODY: dict[str, Any] = {
    "required": True,
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "oneOf": [{"required": ["model"]}, {"required": ["model_url"]}],
                "properties": {
                    "model": {
                        "type": "string",
                        "format": "binary",
                        "description": "A .py file, a .zip of a package, or a .zip of a "
                        "save_pretrained checkpoint (config.json and its weights).",
                    },
                    "inputs": {
                        "type": "string",
                        "format": "binary",
                        "description": "Example inputs: .safetensors, .pt or .json.",
                    },
                    "weights": {
                        "type": "string",
                        "format": "binary",
                        "description": "A state dict (or a training checkpoint holding one): "
                        ".safetensors, .pt or .pth.",
                    },
                    "calibration": {
                        "type": "string",
                        "format": "binary",
                        "description": "Calibration inputs for quantize.scheme int8: a list "
                        "of example inputs as .safetensors, .pt or .json.",
                    },
                    "options": {
                        "type": "string",
                        "description": "ExportOptions as a JSON string (see options.schema.json).",
                    },
                    "model_url": {
                        "type": "string",
                        "maxLength": URL_MAX_LENGTH,
                        "description": "Instead of `model`: an s3:// prefix holding a "
                        "save_pretrained checkpoint, under one the deployment allow-lists; "
                        "read by the worker, never through the API.",
                    },
                    "callback_url": {
                        "type": "string",
                        "maxLength": CALLBACK_URL_MAX_LENGTH,
                        "pattern": CALLBACK_URL_PATTERN,
                        "description": "POSTed the job body, signed, when the job ends.",
                    },
                },
            }
        }
    },
}
"""The OpenAPI description of `POST /v1/exports`'s form."""

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass
class UploadedFile:
    """A file field written to disk."""

    field: str
    filename: str
    path: Path
    sha256: str
    size: int


@dataclass
class UploadedForm:
    """The fields of one upload."""

    files: dict[str, UploadedFile] = field(default_factory=dict)
    options: str | None = None
    callback_url: str | None = None
    model_url: str | None = None
    source: CheckpointSource | None = None
    """The manifest of `model_url`'s checkpoint, once listed (`service.references`)."""


def safe_filename(name: str, default: str) -> str:
    """The base name of an uploaded file reduced to `[A-Za-z0-9._-]`, never empty or hidden."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = _SAFE_NAME.sub("_", base).lstrip(".")
    return base[:200] or default


class _FormCollector:
    """Callbacks of python-multipart's push parser, writing each part where it belongs."""

    def __init__(self, limits: dict[str, int], directory: Path, model_zip_limit: int) -> None:
        self.limits = limits
        self.model_zip_limit = model_zip_limit
        self.directory = directory
        self.form = UploadedForm()
        self.finished = False
        self._header_field = b""
        self._header_value = b""
        self._headers: dict[bytes, bytes] = {}
        self._field: str | None = None
        self._filename: str | None = None
        self._limit = 0
        self._limit_name = ""
        self._file: IO[bytes] | None = None
        self._hash = hashlib.sha256()
        self._size = 0
        self._text = bytearray()
        self._seen: set[str] = set()

    def callbacks(self) -> dict[str, object]:
        return {
            "on_part_begin": self._part_begin,
            "on_header_field": self._header_field_data,
            "on_header_value": self._header_value_data,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._part_data,
            "on_part_end": self._part_end,
            "on_end": self._end,
        }

    def _part_begin(self) -> None:
        self._headers = {}
        self._field = None
        self._filename = None
        self._size = 0
        self._hash = hashlib.sha256()
        self._text = bytearray()

    def _header_field_data(self, data: bytes, start: int, end: int) -> None:
        self._header_field += data[start:end]

    def _header_value_data(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def _header_end(self) -> None:
        self._headers[self._header_field.strip().lower()] = self._header_value.strip()
        self._header_field = b""
        self._header_value = b""

    def _headers_finished(self) -> None:
        disposition = self._headers.get(b"content-disposition")
        if disposition is None:
            raise InvalidRequest("multipart part without Content-Disposition")
        _, params = parse_options_header(disposition)
        try:
            name = params.get(b"name", b"").decode("utf-8")
            filename = params[b"filename"].decode("utf-8") if b"filename" in params else None
        except UnicodeDecodeError as exc:
            raise InvalidRequest("multipart field names must be UTF-8") from exc
        if name not in FILE_FIELDS and name not in TEXT_FIELDS:
            raise InvalidRequest(
                f"unknown form field {name!r}",
                details={"field": name, "allowed": [*FILE_FIELDS, *TEXT_FIELDS]},
            )
        if name in self._seen:
            raise InvalidRequest(f"form field {name!r} given twice", details={"field": name})
        self._seen.add(name)
        self._field = name
        self._limit, self._limit_name = self.limits[name], name
        if name in FILE_FIELDS:
            self._filename = safe_filename(filename or name, default=name)
            self._file = (self.directory / name).open("wb")
            is_zip = self._filename.lower().endswith(".zip")
            if name == "model" and is_zip and self.model_zip_limit > self._limit:
                self._limit, self._limit_name = self.model_zip_limit, "checkpoint"

    def _part_data(self, data: bytes, start: int, end: int) -> None:
        assert self._field is not None
        chunk = data[start:end]
        self._size += len(chunk)
        if self._size > self._limit:
            raise UploadTooLarge(
                f"{self._field} is over its limit of {self._limit} bytes",
                details={
                    "field": self._field,
                    "limit_bytes": self._limit,
                    "limit": self._limit_name,
                },
            )
        if self._file is not None:
            self._file.write(chunk)
            self._hash.update(chunk)
        else:
            self._text.extend(chunk)

    def _part_end(self) -> None:
        assert self._field is not None
        if self._file is not None:
            self._file.close()
            self._file = None
            self.form.files[self._field] = UploadedFile(
                field=self._field,
                filename=self._filename or self._field,
                path=self.directory / self._field,
                sha256=self._hash.hexdigest(),
                size=self._size,
            )
        else:
            try:
                text = bytes(self._text).decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InvalidRequest(
                    f"{self._field} must be UTF-8", details={"field": self._field}
                ) from exc
            setattr(self.form, self._field, text)

    def _end(self) -> None:
        self.finished = True

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


async def receive_form(
    request: Request, limits: dict[str, int], directory: Path, *, model_zip_limit: int = 0
) -> UploadedForm:
    """Parse the multipart body of `request` into `directory`, enforcing per-field limits.

    A `model` whose file name ends in `.zip` may stream up to `model_zip_limit` where that
    is larger than its field's limit (a checkpoint; `details.limit` is then `checkpoint`).

    Raises:
        InvalidRequest: not multipart, malformed, truncated, unknown or repeated fields.
        UploadTooLarge: a field over its limit (or a body over the sum of all limits).
    """
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or b"boundary" not in params:
        raise InvalidRequest(
            "the body must be multipart/form-data with a boundary",
            details={"content_type": request.headers.get("content-type")},
        )
    total_limit = sum(limits.values()) + MULTIPART_OVERHEAD
    total_limit += max(0, model_zip_limit - limits["model"])
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > total_limit:
        raise UploadTooLarge(
            f"the request body is over the limit of {total_limit} bytes",
            details={"field": None, "limit_bytes": total_limit, "limit": "request"},
        )
    collector = _FormCollector(limits, directory, model_zip_limit)
    parser = MultipartParser(params[b"boundary"], collector.callbacks())  # type: ignore[arg-type]
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > total_limit:
                raise UploadTooLarge(
                    f"the request body is over the limit of {total_limit} bytes",
                    details={"field": None, "limit_bytes": total_limit, "limit": "request"},
                )
            parser.write(chunk)
        parser.finalize()
    except MultipartParseError as exc:
        raise InvalidRequest("malformed multipart body", details={"reason": str(exc)}) from exc
    except ClientDisconnect as exc:
        raise InvalidRequest("the client disconnected during the upload") from exc
    finally:
        collector.close()
    if not collector.finished:
        raise InvalidRequest("truncated multipart body: the closing boundary is missing")
    return collector.form
