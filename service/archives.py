"""A model zip's central directory, read once at upload, and one file out of a stored zip.

The directory is bounded before anything parses it: in entries (`schemas.limits`) and in
bytes (`TORCHPORT_MAX_ZIP_DIRECTORY_BYTES`, since 10,000 entries with 64 KiB names,
extra fields and comments make a 2 GB directory), both read off the end record. The
upload's checks parse it once and keep where each regular file lies
(`persistence.zip_index`). The failure page shows the user's source around the failing
line; for a zip upload the error's `location.file` is a path inside the archive (as the
engine unpacked it), and `read_member` returns that one member's bytes: one lookup, then
its local header and data as range reads of the blob. Reading a zip runs no user code
(it is not pickle), and nothing is extracted.
"""

from __future__ import annotations

import io
import lzma
import struct
import zipfile
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from persistence import zip_index
from persistence.store import ArtifactStore
from persistence.zip_index import MemberLocation, ZipIndex
from schemas.limits import ZIP_MAX_ENTRIES
from service.errors import InvalidRequest, NotFound, UploadTooLarge

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

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
MAX_MEMBER_COMPRESSED_BYTES = MAX_MEMBER_BYTES + MAX_MEMBER_BYTES // 8
"""Largest compressed member served: what compressing a served member can take (deflate,
bzip2 and LZMA add well under 1/8 to incompressible data), so data that inflate to little
are never inflated for long."""
MAX_ZIP_DIRECTORY_BYTES = 4 * 1024 * 1024
"""Default bound on a model zip's central directory (`TORCHPORT_MAX_ZIP_DIRECTORY_BYTES`):
10,000 entries of about 400 bytes of name, extra field and comment each."""

_EOCD = struct.Struct("<4s4H2LH")
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
_CENTRAL_HEADER = struct.Struct("<4s4B4HL2L5H2L")
_LOCAL_HEADER = struct.Struct(zipfile.structFileHeader)  # type: ignore[attr-defined]
_MAX_COMMENT = 65535
_RANGE_READ = 64 * 1024
"""Bytes a stored zip's file reads at least per range read while it is being indexed."""
_UTF8_NAME = 0x800
_ENCRYPTED = 0x1
_UNSUPPORTED = 0x20 | 0x40  # compressed patched data, strong encryption


class DirectoryTooLarge(Exception):
    """A central directory over its bound in bytes, found before it was read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"central directory of {size} bytes, over {limit}")
        self.size = size
        self.limit = limit


def count_entries(path: Path, limit: int, *, max_bytes: int | None = None) -> int:
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
        DirectoryTooLarge: the directory is over `max_bytes` (told by the end record,
            before the directory is read).
    """
    with path.open("rb") as f:
        return _count(f, limit, max_bytes)


def _count(f: IO[bytes], limit: int, max_bytes: int | None) -> int:
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
    if max_bytes is not None and directory_size > max_bytes:
        raise DirectoryTooLarge(directory_size, max_bytes)
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


def locate(members: Iterable[zipfile.ZipInfo], archive_size: int) -> dict[str, MemberLocation]:
    """Where each regular file of a parsed directory lies, by its unpacked path; of two
    entries with the same path the last wins, as the engine unpacks them in order.

    Raises:
        zipfile.BadZipFile: a member's header and data would lie outside the archive.
    """
    index: dict[str, MemberLocation] = {}
    for info in members:
        parts = member_parts(info.filename)
        if info.is_dir() or not parts or ".." in parts:
            continue  # never served
        end = info.header_offset + _LOCAL_HEADER.size + info.compress_size
        if info.header_offset < 0 or end > archive_size:
            raise zipfile.BadZipFile(f"{info.filename!r} lies outside the archive")
        index["/".join(parts)] = MemberLocation(
            header_offset=info.header_offset,
            compress_size=info.compress_size,
            file_size=info.file_size,
            compress_type=info.compress_type,
            flag_bits=info.flag_bits,
            crc=info.CRC,
        )
    return index


class _StoredFile(io.RawIOBase):
    """A stored blob as a seekable file whose every read is one range read of the store,
    so `zipfile` reads a zip's end record and directory and nothing else of it."""

    def __init__(self, store: ArtifactStore, sha256: str) -> None:
        self._store, self._sha256 = store, sha256
        self._size, self._position = store.size(sha256), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        if base + offset < 0:
            raise OSError("seek before the start of the blob")
        self._position = base + offset
        return self._position

    def readinto(self, buffer: WriteableBuffer) -> int:
        view = memoryview(buffer).cast("B")
        data = _read_range(self._store, self._sha256, self._position, len(view))
        view[: len(data)] = data
        self._position += len(data)
        return len(data)

    def readall(self) -> bytes:
        data = _read_range(self._store, self._sha256, self._position, self._size - self._position)
        self._position += len(data)
        return data


def _read_range(store: ArtifactStore, sha256: str, start: int, length: int) -> bytes:
    """Up to `length` bytes of the blob from `start` (fewer at its end)."""
    if length <= 0:
        return b""
    return b"".join(store.read(sha256, start, start + length - 1))


def index_stored(
    store: ArtifactStore, sha256: str, *, max_directory_bytes: int, job_id: str, member: str
) -> ZipIndex:
    """Parse a stored zip's directory (within both bounds) into its index: for a zip
    stored before indexes were recorded at upload. Only the directory is read.

    Raises:
        InvalidRequest: the archive cannot be read (`details.reason` `bad_zip`) or its
            directory is over a bound (`zip_too_large`).
    """
    details = {"job_id": job_id, "member": member}
    try:
        with io.BufferedReader(_StoredFile(store, sha256), buffer_size=_RANGE_READ) as blob:
            if _count(blob, ZIP_MAX_ENTRIES, max_directory_bytes) > ZIP_MAX_ENTRIES:
                raise InvalidRequest(
                    "the model zip has too many entries",
                    details={**details, "reason": "zip_too_large", "max_entries": ZIP_MAX_ENTRIES},
                )
            with zipfile.ZipFile(blob) as archive:
                return locate(archive.infolist(), blob.seek(0, io.SEEK_END))
    except DirectoryTooLarge as exc:
        raise InvalidRequest(
            "the model zip's directory is too large",
            details={
                **details,
                "reason": "zip_too_large",
                "max_directory_bytes": exc.limit,
                "directory_bytes": exc.size,
            },
        ) from exc
    except _UNREADABLE as exc:
        raise InvalidRequest(
            "the model zip cannot be read", details={**details, "reason": "bad_zip"}
        ) from exc


def read_member(
    session: Session,
    store: ArtifactStore,
    sha256: str,
    member: str,
    *,
    job_id: str,
    max_directory_bytes: int,
) -> tuple[str, bytes]:
    """The bytes of one regular file of a stored zip, found by its unpacked path in the
    zip's index; a zip stored without one is indexed now (`index_stored`) and its index
    recorded (the session is committed).

    Returns:
        The member's path as the engine names it, and its bytes.

    Raises:
        NotFound: no regular file of that path in the archive (details `member`).
        UploadTooLarge: the member is over `MAX_MEMBER_BYTES`, or its compressed data
            over `MAX_MEMBER_COMPRESSED_BYTES` (details `limit_bytes`, `size`).
        InvalidRequest: the archive or the member cannot be read (details `reason`
            `bad_zip`, as the engine reports the same archive), or the directory of a zip
            stored without an index is over a bound (`zip_too_large`).
    """
    wanted = member_parts(member)
    missing = NotFound(
        f"the model zip has no file {member!r}", details={"job_id": job_id, "member": member}
    )
    if not wanted or ".." in wanted:
        raise missing
    path = "/".join(wanted)
    location = zip_index.find(session, sha256, path)
    if location is None and not zip_index.indexed(session, sha256):
        index = index_stored(
            store, sha256, max_directory_bytes=max_directory_bytes, job_id=job_id, member=member
        )
        try:
            zip_index.record(session, sha256, index)
            session.commit()
        except IntegrityError:  # its blob row went meanwhile: serve it, unrecorded
            session.rollback()
        location = index.get(path)
    if location is None:
        raise missing
    return path, read_at(store, sha256, location, path, job_id=job_id, member=member)


def read_at(
    store: ArtifactStore,
    sha256: str,
    location: MemberLocation,
    path: str,
    *,
    job_id: str,
    member: str,
) -> bytes:
    """The bytes of the member at `location` of a stored zip, whose local header must name
    `path` (unpacked): its local header and its data are two range reads of the blob.

    Raises:
        UploadTooLarge, InvalidRequest: as `read_member`.
    """
    if location.file_size > MAX_MEMBER_BYTES or location.compress_size > (
        MAX_MEMBER_COMPRESSED_BYTES
    ):
        raise _too_large(job_id, member, max(location.file_size, location.compress_size))
    try:
        data = _read_data(store, sha256, location, path)
    except _UNREADABLE as exc:
        raise InvalidRequest(
            "the model zip cannot be read",
            details={"job_id": job_id, "member": member, "reason": "bad_zip"},
        ) from exc
    if len(data) > MAX_MEMBER_BYTES:  # a header that understated the size
        raise _too_large(job_id, member, len(data))
    return data


def _read_data(store: ArtifactStore, sha256: str, location: MemberLocation, path: str) -> bytes:
    """Read and decompress a member as `zipfile.ZipFile.open` does, from its location."""
    if location.flag_bits & _UNSUPPORTED:
        raise NotImplementedError("compressed patched data or strong encryption")
    if location.flag_bits & _ENCRYPTED:
        raise RuntimeError("encrypted member")
    header = _read_range(store, sha256, location.header_offset, _LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size:
        raise zipfile.BadZipFile("truncated file header")
    fields = _LOCAL_HEADER.unpack(header)
    if fields[0] != zipfile.stringFileHeader:  # type: ignore[attr-defined]
        raise zipfile.BadZipFile("bad magic number for file header")
    name_length, extra_length = fields[10], fields[11]
    start = location.header_offset + _LOCAL_HEADER.size
    both = _read_range(store, sha256, start, name_length + extra_length + location.compress_size)
    if len(both) != name_length + extra_length + location.compress_size:
        raise zipfile.BadZipFile("truncated member")
    name = both[:name_length].decode("utf-8" if fields[3] & _UTF8_NAME else "cp437")
    if "/".join(member_parts(name)) != path:
        raise zipfile.BadZipFile("file name in directory and header differ")
    info = zipfile.ZipInfo(path)
    info.compress_type = location.compress_type
    info.compress_size = location.compress_size
    info.file_size = location.file_size
    info.flag_bits = location.flag_bits
    info.CRC = location.crc
    compressed = io.BytesIO(both[name_length + extra_length :])
    with zipfile.ZipExtFile(compressed, "r", info) as handle:
        return handle.read(MAX_MEMBER_BYTES + 1)


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
