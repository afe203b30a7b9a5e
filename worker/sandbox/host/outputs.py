"""A job's outputs as the worker takes them: untrusted files, read without following
links and within size limits, the documents validated against their schemas, the
program checked to be a zip archive; copied out of the job's reach and hashed as
copied when taken while the job child still exits.

A document is counted before it is parsed (`count_items`): what parsing it costs the
worker grows with the values and members it holds, not with its bytes (48 MiB of
`{},{},…` grew the worker by 1.8 GiB), so a document over its item limit is refused
unparsed and the worker's growth is bounded by the limits, whatever the job wrote.

Nothing here unpickles or loads what a job wrote: the round trip ran in a sandboxed
loader child.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, TypeVar

from pydantic import BaseModel, ValidationError

from engine.serialize.artifacts import (
    ENCODER,
    GRAPH,
    PROGRAM,
    REPORT,
    SIGNATURE,
)
from engine.targets.registry import TARGET_ARTIFACTS, TARGET_COMPANIONS, TARGET_FILES
from schemas import ArtifactInfo, GraphDocument, ReportDocument, SignatureDocument
from schemas.model_zip import TOKENIZER_FILES, TOKENIZER_MAX_BYTES
from worker.sandbox.settings import SandboxSettings

__all__ = [
    "ZIP_MAGIC",
    "Accepted",
    "Untrusted",
    "copy_regular",
    "count_items",
    "open_regular",
    "read_regular",
    "take_outputs",
    "take_regular",
    "validate",
]

ZIP_MAGIC = b"PK\x03\x04"

Document = TypeVar("Document", bound=BaseModel)


class Untrusted(ValueError):
    """A job's output failed validation; `details` name the file and the limit it broke,
    when it broke one (they go into the job's error)."""

    def __init__(self, message: str, **details: object) -> None:
        super().__init__(message)
        self.details = details


@dataclass
class Accepted:
    """A job's outputs as the worker took them (`take_outputs`): validated, and when
    taken while the job exits, copied where it cannot reach them and hashed as copied."""

    report: ReportDocument
    files: dict[str, Path]
    infos: dict[str, ArtifactInfo]
    """Size and SHA-256 of each copy, as copied (empty when taken after the exit)."""
    directory: Path | None
    """Where the copies are (None when taken after the exit)."""


def take_outputs(
    produced: Path, settings: SandboxSettings, into: Path | None = None, report: str = REPORT
) -> Accepted | None:
    """A job's outputs, checked as untrusted data: regular files (no links), size
    limits, documents validated against their schemas, the program a zip archive.
    `report`: the report read (`PROVISIONAL_REPORT`: what a job stopped by its time limit
    wrote last), with the same limits and checks as `report.json`.

    After the job's exit (`into` None) they are taken where they are. While it is
    still exiting, each is copied into `into` (out of the job's reach) as it is
    validated and hashed, so what is accepted is what is kept, whatever the job's
    threads write afterwards; None then when the program is larger than
    `early_copy_bytes` (taken after the exit instead, by `results.finish`: copying it
    now would cost more than the exit it overlaps)."""
    s = settings
    program = produced / PROGRAM
    if into is not None:
        size = 0
        for name in (PROGRAM, ENCODER, *TARGET_FILES):
            with contextlib.suppress(FileNotFoundError):
                size += (produced / name).lstat().st_size
        if size > s.early_copy_bytes:
            return None
        shutil.rmtree(into, ignore_errors=True)
        into.mkdir(mode=0o700, parents=True)
    limits = {
        report: (s.max_report_bytes, s.max_report_items),
        GRAPH: (s.max_json_bytes, s.max_json_items),
        SIGNATURE: (s.max_json_bytes, s.max_json_items),
    }
    files: dict[str, Path] = {}
    infos: dict[str, ArtifactInfo] = {}
    document: ReportDocument | None = None
    for name, (limit, max_items) in limits.items():
        data = read_regular(produced / name, limit, whole=True)
        if data is None:
            continue
        if name == report:
            document = validate(ReportDocument, name, data, max_items)
            continue
        validate(GraphDocument if name == GRAPH else SignatureDocument, name, data, max_items)
        files[name] = produced / name
        if into is not None:
            files[name] = into / name
            files[name].write_bytes(data)
            infos[name] = ArtifactInfo(
                name=name, size=len(data), sha256=hashlib.sha256(data).hexdigest()
            )
    if into is None:
        head = read_regular(program, s.max_program_bytes, whole=False)
        if head is not None:
            if not head.startswith(ZIP_MAGIC):
                raise Untrusted("program.pt2 is not a zip archive")
            files[PROGRAM] = program
    else:
        copied = copy_regular(program, into / PROGRAM, s.max_program_bytes)
        if copied is not None:
            if copied.size > s.early_copy_bytes:  # it grew while being copied
                shutil.rmtree(into, ignore_errors=True)
                return None
            files[PROGRAM], infos[PROGRAM] = into / PROGRAM, copied
    if document is None:
        raise Untrusted(f"no {report}")
    if document.status == "failed":
        return Accepted(document, {}, {}, into)
    if set(files) != {PROGRAM, GRAPH, SIGNATURE}:
        raise Untrusted("a succeeded job must produce program.pt2, graph.json, signature.json")
    big = s.max_program_bytes
    wanted: list[tuple[str, str, int]] = []
    if document.generation is not None and document.generation.encoder is not None:
        # an encoder-decoder model's second program, named by us, never by the report
        wanted.append(("the encoder program", ENCODER, big))
    if document.checkpoint is not None:  # the tokenizer's files the report lists, if known
        listed = set(document.checkpoint.tokenizer_files) & set(TOKENIZER_FILES)
        wanted += [("the export", name, TOKENIZER_MAX_BYTES) for name in sorted(listed)]
    for target, artifact in TARGET_ARTIFACTS.items():
        # Only the artifacts of targets the report says succeeded, and of the files a
        # target may write beside its artifact only those its entry lists; each a
        # regular file within the program's limit (an AOTInductor package is a zip too).
        result = document.targets.get(target)
        if result is None or result.status != "succeeded":
            continue
        listed = set(result.artifacts) & set(TARGET_COMPANIONS.get(target, ()))
        wanted += [(f"target {target}", name, big) for name in (artifact, *sorted(listed))]
    for whose, name, limit in wanted:
        magic = ZIP_MAGIC if name.endswith(".pt2") else None
        if into is None:
            head = read_regular(produced / name, limit, whole=False)
            if head is None:
                raise Untrusted(f"{whose} succeeded without {name}")
            if magic is not None and not head.startswith(magic):
                raise Untrusted(f"{name} is not a zip archive")
            files[name] = produced / name
        else:
            copied = copy_regular(produced / name, into / name, limit, magic)
            if copied is None:
                raise Untrusted(f"{whose} succeeded without {name}")
            files[name], infos[name] = into / name, copied
    return Accepted(document, files, infos, into)


def open_regular(path: Path, limit: int) -> BinaryIO | None:
    """A file a job wrote, open for reading: a regular file (no links), at most `limit`
    bytes when opened; None when there is no such file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Untrusted(f"{path.name} cannot be opened safely ({exc.strerror})") from exc
    handle = os.fdopen(fd, "rb")
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        handle.close()
        raise Untrusted(f"{path.name} is not a regular file")
    if info.st_size > limit:
        handle.close()
        raise Untrusted(
            f"{path.name} is larger than {limit} bytes", file=path.name, max_bytes=limit
        )
    return handle


def read_regular(path: Path, limit: int, *, whole: bool) -> bytes | None:
    """A file a job wrote (see `open_regular`): all of it, or its first 4 bytes."""
    handle = open_regular(path, limit)
    if handle is None:
        return None
    with handle:
        return handle.read(limit if whole else 4)


def validate(document: type[Document], name: str, data: bytes, max_items: int) -> Document:
    """A result document the job wrote, or `Untrusted` saying where it is wrong. One with
    more than `max_items` (`count_items`) is refused before it is parsed; nesting is
    bounded by the parser (pydantic's JSON parser refuses more than 200 levels)."""
    items = count_items(data)
    if items > max_items:
        raise Untrusted(
            f"{name} holds more than {max_items} JSON items ({items})",
            file=name,
            max_items=max_items,
            items=items,
        )
    try:
        return document.model_validate_json(data)
    except ValidationError as exc:
        where = ", ".join(".".join(map(str, e["loc"])) or "(top)" for e in exc.errors()[:3])
        raise Untrusted(f"{name} does not match its schema (at {where})") from None


def count_items(data: bytes) -> int:
    """What parsing a JSON document costs, in items: one per comma, colon and opening
    bracket, so at least one per value of an array, member of an object and array or
    object. Those inside strings count too (an upper bound, counted at C speed without
    parsing: ~5 ms for 32 MiB); strings themselves cost only their bytes."""
    return sum(data.count(mark) for mark in (b",", b":", b"[", b"{"))


def take_regular(path: Path, target: Path, limit: int) -> ArtifactInfo | None:
    """Move a file a job wrote to `target` and hash it there, once none of the job's
    processes is left to change it (after the exit: `results.finish`); a copy
    (`copy_regular`) when `target` is on another file system. None when there is no such
    file. Renaming moves a link itself, never what it names; what is then opened is
    opened without following links (`open_regular`), and anything but a non-empty regular
    file of at most `limit` bytes is refused and removed, as `copy_regular` refuses it.
    The worker then owns it, mode 0644, as it owns a copy: a 1.1 GB program in 0.7 s
    instead of 3.5 s."""
    try:
        os.rename(path, target)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.EACCES, errno.EPERM):
            raise Untrusted(f"{path.name} cannot be taken ({exc.strerror})") from exc
        return copy_regular(path, target, limit, magic=None)  # elsewhere, or not ours
    try:
        handle = open_regular(target, limit)
        if handle is None:
            raise Untrusted(f"{path.name} disappeared")
        with handle:
            with contextlib.suppress(PermissionError):  # a worker that is not root
                os.fchown(handle.fileno(), os.getuid(), os.getgid())
                os.fchmod(handle.fileno(), 0o644)
            return _hashed(handle, path.name, limit, magic=None)
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def copy_regular(
    path: Path, target: Path, limit: int, magic: bytes | None = ZIP_MAGIC
) -> ArtifactInfo | None:
    """Copy a file a job wrote (see `open_regular`) to `target`, hashing what is copied
    and stopping at `limit` bytes; None when there is no such file. `magic`: how it
    must start (a zip archive by default; None: any non-empty file)."""
    source = open_regular(path, limit)
    if source is None:
        return None
    with source, target.open("x+b") as copy:
        try:  # in the kernel, then hashed as copied: what is kept is what is checked
            left = limit + 1  # one byte over says it grew past the limit
            while left > 0 and (done := os.copy_file_range(source.fileno(), copy.fileno(), left)):
                left -= done
        except OSError:  # a file system or kernel without it: through this process
            copy.seek(0)
            copy.truncate()
            source.seek(0)
            return _hashed(source, path.name, limit, magic, copy.write)
        copy.seek(0)
        return _hashed(copy, path.name, limit, magic)


def _hashed(
    source: BinaryIO,
    name: str,
    limit: int,
    magic: bytes | None,
    write: Callable[[bytes], object] | None = None,
) -> ArtifactInfo:
    """Read a job's file to its end in 1 MiB chunks, hashing them (and passing each to
    `write`): refused when it does not start with `magic`, grew past `limit` while being
    read, or is empty."""
    digest, size = hashlib.sha256(), 0
    while chunk := source.read(1 << 20):
        if size == 0 and magic is not None and not chunk.startswith(magic):
            raise Untrusted(f"{name} is not a zip archive")
        size += len(chunk)
        if size > limit:  # it grew while being read
            raise Untrusted(f"{name} is larger than {limit} bytes")
        digest.update(chunk)
        if write is not None:
            write(chunk)
    if size == 0:
        raise Untrusted(f"{name} is empty")
    return ArtifactInfo(name=name, size=size, sha256=digest.hexdigest())
