"""Where the regular files of uploaded model zips lie in their blobs (`zip_members`).

The API parses a model zip's central directory once, at upload, and records here each
regular file's local header offset, sizes, compression method, flags and CRC under its
path as the engine unpacks it; a later read of one file (`service.archives`) is one
lookup and a range read of the blob, however large the directory. Blobs are
content-addressed, so an index is recorded once per blob and holds for every job that
uploaded the same bytes; it goes with the blob's `blobs` row.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from sqlalchemy import exists, select
from sqlalchemy.orm import Session

from persistence.database import upsert
from persistence.models import ZipMember


@dataclass(frozen=True)
class MemberLocation:
    """One regular file of a zip: what reading it needs besides the blob."""

    header_offset: int
    """Where its local header starts in the blob."""
    compress_size: int
    file_size: int
    compress_type: int
    flag_bits: int
    crc: int


ZipIndex = Mapping[str, MemberLocation]
"""A zip's regular files by their unpacked path (`pkg/net.py`)."""


def path_key(path: str) -> str:
    """The key of a member's path in the table: its SHA-256 (a path may be 64 KiB long)."""
    return hashlib.sha256(path.encode("utf-8", "surrogatepass")).hexdigest()


def indexed(session: Session, blob_sha256: str) -> bool:
    """Whether the blob's index was recorded (a zip stored before the table was not)."""
    return bool(session.scalar(select(exists().where(ZipMember.blob_sha256 == blob_sha256))))


def record(session: Session, blob_sha256: str, index: ZipIndex) -> None:
    """Record a zip's index, unless it is already there (the same bytes uploaded again,
    or two requests indexing an older zip at once). The blob's `blobs` row must exist.
    """
    if not index or indexed(session, blob_sha256):
        return
    rows = [
        {"blob_sha256": blob_sha256, "path_sha256": path_key(path), **asdict(location)}
        for path, location in index.items()
    ]
    session.execute(upsert(session, ZipMember).on_conflict_do_nothing(), rows)


def find(session: Session, blob_sha256: str, path: str) -> MemberLocation | None:
    """Where the zip's regular file of this unpacked path lies; None when it has none or
    was never indexed (`indexed` tells which)."""
    row = session.scalar(
        select(ZipMember).where(
            ZipMember.blob_sha256 == blob_sha256, ZipMember.path_sha256 == path_key(path)
        )
    )
    if row is None:
        return None
    return MemberLocation(
        header_offset=row.header_offset,
        compress_size=row.compress_size,
        file_size=row.file_size,
        compress_type=row.compress_type,
        flag_bits=row.flag_bits,
        crc=row.crc,
    )
