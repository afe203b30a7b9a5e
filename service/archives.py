"""One file out of an uploaded model zip, read in the API process and never extracted.

The failure page shows the user's source around the failing line; for a zip upload the
error's `location.file` is a path inside the archive (as the engine unpacked it), and
`read_member` returns that one member's bytes. Reading a zip runs no user code (it is not
pickle): only the central directory and one bounded member are read.
"""

from __future__ import annotations

import lzma
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from persistence.store import ArtifactStore, LocalStore
from schemas.limits import ZIP_MAX_ENTRIES
from service.errors import InvalidRequest, NotFound, UploadTooLarge

_UNREADABLE = (
    zipfile.BadZipFile,
    zipfile.LargeZipFile,
    RuntimeError,  # encrypted
    NotImplementedError,  # an unknown compression method
    zlib.error,
    lzma.LZMAError,
    OSError,  # bz2's "Invalid data stream", a truncated file
    EOFError,
    ValueError,
)
"""What reading a hostile archive raises (the store's own errors are not among them)."""

MAX_MEMBER_BYTES = 1024 * 1024
"""Largest member served: source files, not the weights someone zipped along."""


_EOCD = struct.Struct("<4s4H2LH")
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_HEADER = struct.Struct("<4s4B4HL2L5H2L")
_MAX_COMMENT = 65535


def count_entries(path: Path, limit: int) -> int:
    """The entries of a zip's central directory, counted without parsing it: from the
    end-of-central-directory record (zip64 too), then by walking the directory's fixed
    headers as `zipfile` would and stopping after `limit + 1`.

    `zipfile.ZipFile` builds a ZipInfo for every entry before anyone can count them (a
    16 MiB zip can hold 300,000 of them: seconds of CPU); call this first. The walk also
    catches a record whose count understates the directory.

    Returns:
        The number of entries, or any number above `limit` once it is exceeded.

    Raises:
        zipfile.BadZipFile: no end record, or a directory that is not where it says.
    """
    with path.open("rb") as f:
        size = f.seek(0, 2)
        tail_size = min(size, _EOCD.size + _MAX_COMMENT)
        f.seek(size - tail_size)
        tail = f.read(tail_size)
        found = tail.rfind(b"PK\x05\x06")
        if found < 0 or tail_size - found < _EOCD.size:
            raise zipfile.BadZipFile("no end of central directory record")
        record = _EOCD.unpack_from(tail, found)
        entries, directory_size = record[4], record[5]
        end = size - tail_size + found
        if end >= _EOCD64_LOCATOR.size + _EOCD64.size:
            f.seek(end - _EOCD64_LOCATOR.size)
            locator = f.read(_EOCD64_LOCATOR.size)
            if locator[:4] == b"PK\x06\x07":
                f.seek(end - _EOCD64_LOCATOR.size - _EOCD64.size)
                record64 = f.read(_EOCD64.size)
                if record64[:4] != b"PK\x06\x06":
                    raise zipfile.BadZipFile("zip64 locator without its record")
                fields = _EOCD64.unpack(record64)
                entries, directory_size = fields[7], fields[8]
                end -= _EOCD64_LOCATOR.size + _EOCD64.size
        if entries > limit:
            return entries
        start = end - directory_size
        if start < 0:
            raise zipfile.BadZipFile("central directory outside the file")
        f.seek(start)
        directory = f.read(directory_size)
    count = offset = 0
    while offset < directory_size:
        if directory_size - offset < _CENTRAL_HEADER.size:
            raise zipfile.BadZipFile("truncated central directory")
        header = _CENTRAL_HEADER.unpack_from(directory, offset)
        if header[0] != b"PK\x01\x02":
            raise zipfile.BadZipFile("bad central directory entry")
        offset += _CENTRAL_HEADER.size + header[12] + header[13] + header[14]
        count += 1
        if count > limit:
            return count
    return count


def member_parts(name: str) -> list[str]:
    """The path of a zip entry as the engine unpacks it: `/` or `\\` separated, without
    empty and `.` parts (so `./pkg/net.py` is `pkg/net.py`)."""
    return [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]


@contextmanager
def _blob_file(store: ArtifactStore, sha256: str, tmp_root: Path) -> Iterator[Path]:
    """A seekable local file with the blob's bytes (zipfile reads the directory at the end)."""
    if isinstance(store, LocalStore):
        yield store.local_path(sha256)
        return
    tmp_root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=tmp_root, prefix="zip-") as directory:
        path = Path(directory) / "upload.zip"
        store.fetch(sha256, path)
        yield path


def read_member(
    store: ArtifactStore, sha256: str, member: str, *, tmp_root: Path, job_id: str
) -> tuple[str, bytes]:
    """The bytes of one regular file of a stored zip, found by its unpacked path.

    Returns:
        The member's path as the engine names it, and its bytes.

    Raises:
        NotFound: no regular file of that path in the archive (details `member`).
        UploadTooLarge: the member is over `MAX_MEMBER_BYTES` (details `limit_bytes`).
        InvalidRequest: the archive or the member cannot be read (details `reason`
            `bad_zip`, as the engine reports the same archive).
    """
    wanted = member_parts(member)
    missing = NotFound(
        f"the model zip has no file {member!r}", details={"job_id": job_id, "member": member}
    )
    if not wanted or ".." in wanted:
        raise missing
    try:
        with _blob_file(store, sha256, tmp_root) as path:
            if count_entries(path, ZIP_MAX_ENTRIES) > ZIP_MAX_ENTRIES:
                raise InvalidRequest(
                    "the model zip has too many entries",
                    details={"job_id": job_id, "member": member, "reason": "zip_too_large"},
                )
            return _read(path, wanted, member, job_id)
    except _UNREADABLE as exc:
        raise InvalidRequest(
            "the model zip cannot be read",
            details={"job_id": job_id, "member": member, "reason": "bad_zip"},
        ) from exc


def _read(path: Path, wanted: list[str], member: str, job_id: str) -> tuple[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        # The engine unpacks in order, so of two entries with the same path the last wins.
        found = None
        for info in archive.infolist():
            if not info.is_dir() and member_parts(info.filename) == wanted:
                found = info
        if found is None:
            raise NotFound(
                f"the model zip has no file {member!r}",
                details={"job_id": job_id, "member": member},
            )
        if found.file_size > MAX_MEMBER_BYTES:
            raise _too_large(job_id, member, found.file_size)
        with archive.open(found) as handle:
            data = handle.read(MAX_MEMBER_BYTES + 1)
    if len(data) > MAX_MEMBER_BYTES:  # a header that understated the size
        raise _too_large(job_id, member, len(data))
    return "/".join(wanted), data


def _too_large(job_id: str, member: str, size: int) -> UploadTooLarge:
    return UploadTooLarge(
        f"{member} is over the {MAX_MEMBER_BYTES} bytes served from a zip",
        details={
            "job_id": job_id,
            "field": "model",
            "member": member,
            "size": size,
            "limit_bytes": MAX_MEMBER_BYTES,
        },
    )
