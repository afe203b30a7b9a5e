"""The artifact store: content-addressed blobs (uploads and artifacts) by SHA-256.

A local directory by default; an S3-compatible bucket for `s3://bucket/prefix` URLs
(boto3, imported only then). Blobs are immutable: the same bytes are stored once.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

CHUNK = 1024 * 1024
BLOB_MODE = 0o644
"""Every local blob: owned by the service's uid, readable, never executable or setuid."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _sound(path: Path) -> bool:
    """Whether a stored blob is a regular file of this process's uid with mode 0644."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return False
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_uid == os.geteuid()
        and stat.S_IMODE(info.st_mode) == BLOB_MODE
    )


class StoreError(Exception):
    """The store could not be reached or refused an operation (an infrastructure error)."""


class BlobNotFound(StoreError):
    """No blob with that digest."""


def sha256_file(path: Path) -> tuple[str, int]:
    """The hex SHA-256 and size of a file, read in chunks."""
    digest = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size


def _check_digest(sha256: str) -> str:
    if not _SHA256.match(sha256):
        raise BlobNotFound(f"not a sha256 digest: {sha256!r}")
    return sha256


class ArtifactStore(Protocol):
    """What the API and the workers need from a store."""

    url: str

    def put_file(
        self, path: Path, sha256: str | None = None, *, own: bool = False
    ) -> tuple[str, int]:
        """Store a copy of the file's bytes; returns (sha256, size). Idempotent.

        `own`: the file is a private one this process wrote and will delete (an upload it
        received, an artifact the worker copied out of a job's reach), whose `sha256` it
        computed as it wrote it, so a local store may take it over instead of copying it."""
        ...

    def exists(self, sha256: str) -> bool:
        """Whether a blob is stored."""
        ...

    def size(self, sha256: str) -> int:
        """Size of a stored blob in bytes."""
        ...

    def read(self, sha256: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes `start..end` (inclusive) of a blob, in chunks."""
        ...

    def fetch(self, sha256: str, dest: Path) -> None:
        """Copy a blob to a new local file of its own (never a link to the blob)."""
        ...

    def delete(self, sha256: str) -> None:
        """Remove a blob; a blob already gone is no error (`persistence.retention` decides
        which may go)."""
        ...

    def check(self) -> None:
        """Raise StoreError unless the store is reachable and writable."""
        ...


class LocalStore:
    """Blobs as files `<root>/<sha[:2]>/<sha>` in a local directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.url = str(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, sha256: str) -> Path:
        sha256 = _check_digest(sha256)
        return self.root / sha256[:2] / sha256

    def put_file(
        self, path: Path, sha256: str | None = None, *, own: bool = False
    ) -> tuple[str, int]:
        """Store the file's bytes as a blob owned by this process, mode 0644; returns
        (sha256, size).

        The bytes are copied (and hashed while copied), never linked: a job's output is
        owned by the job's uid with the mode the job chose (02777, say), and a hard link
        would make that inode the blob every later identical file reuses. Only with
        `own` and its digest (an upload this process received into its private temporary
        directory, an artifact the worker copied out of a job's reach) is the file linked,
        neither copied nor hashed again, and only when it is a regular file of this
        process's uid with no other link. A stored blob that is not such a file (left by
        an older version) is replaced.
        """
        if own and sha256 is not None:
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and info.st_nlink == 1:
                target = self._path(sha256)
                if not _sound(target):
                    self._install(target, sha256, lambda tmp: os.link(path, tmp))
                return sha256, info.st_size
        digest, size, tmp = self._copy_in(path)
        if sha256 is not None and digest != sha256:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"{path} changed while stored: {digest} is not {sha256}")
        target = self._path(digest)
        if _sound(target):
            tmp.unlink(missing_ok=True)
        else:
            self._install(target, digest, lambda new: os.replace(tmp, new))
        return digest, size

    def _copy_in(self, path: Path) -> tuple[str, int, Path]:
        """Copy `path` into a new private file of the store, hashing it on the way."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=self.root, prefix=".incoming-")
        tmp = Path(tmp_name)
        digest = hashlib.sha256()
        size = 0
        try:
            source = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
            try:
                if not stat.S_ISREG(os.fstat(source).st_mode):
                    raise StoreError(f"{path} is not a regular file")
                with os.fdopen(source, "rb", closefd=False) as reader:
                    while chunk := reader.read(CHUNK):
                        digest.update(chunk)
                        size += len(chunk)
                        _write_all(fd, chunk)
            finally:
                os.close(source)
            os.fchmod(fd, BLOB_MODE)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"could not store {path}: {exc}") from exc
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        finally:
            os.close(fd)
        return digest.hexdigest(), size, tmp

    def _install(self, target: Path, sha256: str, make: Callable[[Path], None]) -> None:
        """Put a blob in place under a temporary name, then rename: readers never see a
        partial blob."""
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.parent / f".incoming-{secrets.token_hex(8)}"
        try:
            make(tmp)
            os.chmod(tmp, BLOB_MODE)
            os.replace(tmp, target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise StoreError(f"could not store blob {sha256}: {exc}") from exc

    def exists(self, sha256: str) -> bool:
        """Whether a blob is stored."""
        try:
            return self._path(sha256).is_file()
        except BlobNotFound:
            return False

    def size(self, sha256: str) -> int:
        """Size of a stored blob in bytes."""
        try:
            return self._path(sha256).stat().st_size
        except FileNotFoundError as exc:
            raise BlobNotFound(sha256) from exc

    def read(self, sha256: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes `start..end` (inclusive) of a blob, in chunks."""
        path = self._path(sha256)
        try:
            f = path.open("rb")
        except FileNotFoundError as exc:
            raise BlobNotFound(sha256) from exc
        return self._chunks(f, start, end)

    @staticmethod
    def _chunks(f: Any, start: int, end: int | None) -> Iterator[bytes]:
        with f:
            f.seek(start)
            remaining = None if end is None else end - start + 1
            while remaining is None or remaining > 0:
                chunk = f.read(CHUNK if remaining is None else min(CHUNK, remaining))
                if not chunk:
                    return
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk

    def local_path(self, sha256: str) -> Path:
        """The file holding a blob (local stores only)."""
        path = self._path(sha256)
        if not path.is_file():
            raise BlobNotFound(sha256)
        return path

    def fetch(self, sha256: str, dest: Path) -> None:
        """Copy a blob to `dest`: a copy, never a link (`dest` may be handed to a job's
        uid, and a link would hand it the blob every identical upload shares)."""
        source = self.local_path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, dest)

    def delete(self, sha256: str) -> None:
        """Remove the blob's file (readers that opened it keep reading it)."""
        try:
            self._path(sha256).unlink(missing_ok=True)
        except OSError as exc:
            raise StoreError(f"could not delete blob {sha256}: {exc}") from exc

    def check(self) -> None:
        """Raise StoreError unless the directory is writable."""
        try:
            with tempfile.NamedTemporaryFile(dir=self.root, prefix=".ready-"):
                pass
        except OSError as exc:
            raise StoreError(f"artifact directory not writable: {exc}") from exc


def _error_code(exc: BaseException | None) -> str:
    """The S3 error code of a botocore `ClientError` ("" for anything else)."""
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code", "")) if isinstance(response, dict) else ""


class S3Store:
    """Blobs as objects `<prefix>/<sha[:2]>/<sha>` in an S3-compatible bucket."""

    def __init__(self, url: str, endpoint_url: str | None = None) -> None:
        import boto3
        from botocore.config import Config

        self.url = url
        rest = url.removeprefix("s3://")
        self.bucket, _, prefix = rest.partition("/")
        self.prefix = prefix.strip("/")
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            config=Config(retries={"max_attempts": 3, "mode": "standard"}),
        )

    def _key(self, sha256: str) -> str:
        sha256 = _check_digest(sha256)
        key = f"{sha256[:2]}/{sha256}"
        return f"{self.prefix}/{key}" if self.prefix else key

    def _call(self, name: str, **kwargs: Any) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return getattr(self._client, name)(**kwargs)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                raise BlobNotFound(kwargs.get("Key", "")) from exc
            raise StoreError(f"S3 {name} failed: {exc}") from exc
        except BotoCoreError as exc:
            raise StoreError(f"S3 {name} failed: {exc}") from exc

    def put_file(
        self, path: Path, sha256: str | None = None, *, own: bool = False
    ) -> tuple[str, int]:
        """Upload the file unless an object with its digest exists; returns (sha256, size)."""
        if sha256 is None:
            sha256, size = sha256_file(path)
        else:
            size = path.stat().st_size
        if not self.exists(sha256):
            from botocore.exceptions import BotoCoreError, ClientError

            try:
                self._client.upload_file(str(path), self.bucket, self._key(sha256))
            except (BotoCoreError, ClientError) as exc:
                raise StoreError(f"S3 upload failed: {exc}") from exc
        return sha256, size

    def exists(self, sha256: str) -> bool:
        """Whether an object with this digest exists."""
        try:
            self._call("head_object", Bucket=self.bucket, Key=self._key(sha256))
        except BlobNotFound:
            return False
        return True

    def size(self, sha256: str) -> int:
        """Size of the object in bytes."""
        head = self._call("head_object", Bucket=self.bucket, Key=self._key(sha256))
        return int(head["ContentLength"])

    def read(self, sha256: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The bytes `start..end` (inclusive) of the object, in chunks; none from `start`
        at or past its end (as a local file reads), where S3 answers 416."""
        byte_range = f"bytes={start}-{'' if end is None else end}"
        try:
            answer = self._call(
                "get_object", Bucket=self.bucket, Key=self._key(sha256), Range=byte_range
            )
        except StoreError as exc:
            if _error_code(exc.__cause__) != "InvalidRange":
                raise
            return iter(())
        body = answer["Body"]
        return iter(lambda: body.read(CHUNK), b"")

    def fetch(self, sha256: str, dest: Path) -> None:
        """Download the object to `dest`."""
        dest.parent.mkdir(parents=True, exist_ok=True)
        self._call("download_file", Bucket=self.bucket, Key=self._key(sha256), Filename=str(dest))

    def delete(self, sha256: str) -> None:
        """Delete the object (S3 answers a missing key as deleted)."""
        self._call("delete_object", Bucket=self.bucket, Key=self._key(sha256))

    def check(self) -> None:
        """Raise StoreError unless the bucket answers."""
        self._call("head_bucket", Bucket=self.bucket)


def open_store(url: str, *, s3_endpoint_url: str | None = None) -> ArtifactStore:
    """The store for `url`: `s3://bucket/prefix`, `file:///dir` or a directory path."""
    if url.startswith("s3://"):
        return S3Store(url, endpoint_url=s3_endpoint_url)
    return LocalStore(Path(url.removeprefix("file://")).expanduser())
