"""One file out of an uploaded model zip, read in the API process and never extracted.

The failure page shows the user's source around the failing line; for a zip upload the
error's `location.file` is a path inside the archive (as the engine unpacked it), and
`read_member` returns that one member's bytes. Reading a zip runs no user code (it is not
pickle): only the central directory and one bounded member are read.
"""

from __future__ import annotations

import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.errors import InvalidRequest, NotFound, UploadTooLarge
from service.store import ArtifactStore, LocalStore

MAX_MEMBER_BYTES = 1024 * 1024
"""Largest member served: source files, not the weights someone zipped along."""


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
        with _blob_file(store, sha256, tmp_root) as path, zipfile.ZipFile(path) as archive:
            # The engine unpacks in order, so of two entries with the same path the last wins.
            found = None
            for info in archive.infolist():
                if not info.is_dir() and member_parts(info.filename) == wanted:
                    found = info
            if found is None:
                raise missing
            if found.file_size > MAX_MEMBER_BYTES:
                raise _too_large(job_id, member, found.file_size)
            with archive.open(found) as handle:
                data = handle.read(MAX_MEMBER_BYTES + 1)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, RuntimeError, zlib.error, EOFError) as exc:
        raise InvalidRequest(
            "the model zip cannot be read",
            details={"job_id": job_id, "member": member, "reason": "bad_zip"},
        ) from exc
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
