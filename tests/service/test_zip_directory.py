"""What the API parses of a model zip's central directory, against real PostgreSQL and Redis.

Issue 33, item 8: a checkpoint zip with a 273 MiB central directory (10,000 entries, long
comments) grew the API by 538 MiB at upload and by 2 GiB for 4 parallel `GET`s of one of
its files, 7.9 s each, since every such request parsed the whole directory again. The
directory is now bounded in bytes (`TORCHPORT_MAX_ZIP_DIRECTORY_BYTES`) as well as in
entries, parsed once at upload, and a file of it is read from where the upload's index
puts it.
"""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from persistence import retention
from schemas import JobPublic
from schemas.limits import ZIP_MAX_ENTRIES
from service.app import build_state, create_app
from service.archives import MAX_MEMBER_BYTES
from service.deps import AppState
from tests.service.conftest import LOOPBACK_CLIENT, make_settings, truncate

NET = b"import torch\n\n\nclass Net(torch.nn.Module):\n    pass\n"
CHECKPOINT = {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"x" * 64}
_CENTRAL_FIXED = 46
"""Bytes of a central directory record before its name, extra field and comment."""


def bloated(members: dict[str, bytes], kind: str, pad_entries: int, pad_bytes: int) -> bytes:
    """A zip of `members` and `pad_entries` empty files whose central directory records
    each carry `pad_bytes` more: a long name, a long extra field or a long comment."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
        for i in range(pad_entries):
            stem = f"pad/{i:05d}"
            info = zipfile.ZipInfo(stem + ("n" * pad_bytes if kind == "name" else "") + ".txt")
            if kind == "extra":
                info.extra = struct.pack("<2H", 0xCAFE, pad_bytes - 4) + b"e" * (pad_bytes - 4)
            elif kind == "comment":
                info.comment = b"c" * pad_bytes
            archive.writestr(info, b"")
    return buffer.getvalue()


def directory_bytes(data: bytes) -> int:
    """The central directory's size as the end record declares it."""
    return int(struct.unpack_from("<L", data, len(data) - 22 + 12)[0])


def submit(client: TestClient, data: bytes) -> Any:
    return client.post("/v1/exports", files={"model": ("ckpt.zip", data)})


@pytest.fixture
def bounded(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> Iterator[Callable[[int], TestClient]]:
    """The API (PostgreSQL, Redis) with `TORCHPORT_MAX_ZIP_DIRECTORY_BYTES` set."""
    opened: list[tuple[AppState, TestClient]] = []

    def make(limit: int) -> TestClient:
        settings = make_settings(
            tmp_path / f"bound-{limit}", pg_url, redis_prefix, max_zip_directory_bytes=limit
        )
        state = build_state(settings)
        truncate(state.engine)
        client = TestClient(create_app(state=state), client=LOOPBACK_CLIENT)
        client.__enter__()
        opened.append((state, client))
        return client

    yield make
    for state, client in opened:
        client.__exit__(None, None, None)
        truncate(state.engine)
        state.engine.dispose()


@pytest.mark.parametrize("kind", ["name", "extra", "comment"])
def test_a_checkpoint_whose_directory_is_over_the_bound_is_refused(
    client: TestClient, state: AppState, kind: str
) -> None:
    bound = state.settings.max_zip_directory_bytes
    pad_entries = 2_000
    data = bloated(CHECKPOINT, kind, pad_entries, bound // pad_entries + 1)
    assert pad_entries + len(CHECKPOINT) <= ZIP_MAX_ENTRIES  # the entry bound holds
    assert directory_bytes(data) > bound
    answer = submit(client, data)
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert body["code"] == "invalid_request"
    details = body["details"]
    assert (details["field"], details["reason"], details["limit"]) == (
        "model",
        "zip_too_large",
        "directory",
    )
    assert details["max_directory_bytes"] == bound
    assert details["directory_bytes"] == directory_bytes(data)
    with state.engine.connect() as connection:  # nothing stored for a refused upload
        assert connection.execute(text("SELECT count(*) FROM jobs")).scalar() == 0


def test_the_bound_is_the_setting_exactly(bounded: Callable[[int], TestClient]) -> None:
    data = bloated(CHECKPOINT, "comment", 50, 100)
    size = directory_bytes(data)
    refused = submit(bounded(size - 1), data)
    assert refused.status_code == 400, refused.text
    assert refused.json()["details"]["max_directory_bytes"] == size - 1
    assert submit(bounded(size), data).status_code == 202


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every parse of a whole central directory by `zipfile` in this process from now on."""
    seen: list[str] = []
    real = zipfile.ZipFile._RealGetContents  # type: ignore[attr-defined]

    def counted(self: zipfile.ZipFile) -> None:
        seen.append(str(self.filename))
        real(self)

    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", counted)
    return seen


@pytest.fixture
def reads(state: AppState, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The bytes of every chunk the API reads from its store from now on."""
    chunks: list[int] = []
    real = state.store.read

    def counted(sha256: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        for chunk in real(sha256, start, end):
            chunks.append(len(chunk))
            yield chunk

    monkeypatch.setattr(state.store, "read", counted)
    return chunks


def test_a_member_is_read_without_parsing_the_directory_again(
    client: TestClient, state: AppState, parses: list[str], reads: list[int]
) -> None:
    members = {"pkg/__init__.py": b"", "pkg/net.py": NET, "pkg/other.py": b"y = 2\n"}
    data = bloated(members, "comment", 3_000, 400)
    assert directory_bytes(data) > 1024 * 1024
    job = JobPublic.model_validate(submit(client, data).json())
    parsed_at_upload = len(parses)
    assert parsed_at_upload == 1  # once, at upload
    base = f"/v1/exports/{job.id}/uploads/model/files"
    for _ in range(3):
        answer = client.get(f"{base}/pkg/net.py")
        assert (answer.status_code, answer.content) == (200, NET)
    assert client.get(f"{base}/pkg/other.py").content == b"y = 2\n"
    assert client.get(f"{base}/pad/00001.txt").content == b""
    assert client.get(f"{base}/pkg/missing.py").status_code == 404
    assert len(parses) == parsed_at_upload
    # Only the members' local headers and data were read, never the 1 MiB directory.
    assert sum(reads) < directory_bytes(data) // 4


def test_a_zip_stored_before_the_index_is_indexed_at_its_first_member_read(
    client: TestClient, state: AppState, parses: list[str]
) -> None:
    data = bloated({"pkg/net.py": NET, "./pkg/net.py": b"last = True\n"}, "comment", 20, 10)
    job = JobPublic.model_validate(submit(client, data).json())
    with state.engine.begin() as connection:  # as an upload of an older version left it
        connection.execute(text("DELETE FROM zip_members"))
    base = f"/v1/exports/{job.id}/uploads/model/files"
    before = len(parses)
    # Of two entries with the same path the last wins, as the engine unpacks them.
    assert client.get(f"{base}/pkg/net.py").content == b"last = True\n"
    assert len(parses) == before + 1
    assert client.get(f"{base}/pkg/net.py").content == b"last = True\n"
    assert client.get(f"{base}/pkg/nope.py").status_code == 404
    assert len(parses) == before + 1


def test_a_member_whose_data_lies_outside_the_archive_is_refused_at_upload(
    client: TestClient,
) -> None:
    data = bytearray(bloated({"pkg/net.py": NET}, "comment", 0, 0))
    central = bytes(data).rindex(b"PK\x01\x02")
    # The one record's local header offset (at +42) moved past the end of the file.
    struct.pack_into("<L", data, central + 42, len(data) + 100)
    answer = submit(client, bytes(data))
    assert answer.status_code == 400, answer.text
    assert answer.json()["details"]["reason"] == "bad_zip"


def test_a_member_whose_compressed_size_is_over_the_bound_is_not_inflated(
    client: TestClient, reads: list[int]
) -> None:
    # 2 MiB of deflate data that inflate to nothing (empty stored blocks), declared as a
    # 6-byte file: only its compressed size gives it away.
    junk = b"\x00\x00\x00\xff\xff" * (2 * 1024 * 1024 // 5) + b"\x03\x00"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("pkg/net.py", NET)
        archive.writestr("pkg/slow.py", junk)
    data = bytearray(buffer.getvalue())
    local = bytes(data).index(b"PK\x03\x04", 1)
    central = bytes(data).rindex(b"PK\x01\x02")
    for header, method, crc, size in ((local, 8, 14, 22), (central, 10, 16, 24)):
        struct.pack_into("<H", data, header + method, zipfile.ZIP_DEFLATED)
        struct.pack_into("<L", data, header + crc, zlib.crc32(b"x = 1\n"))
        struct.pack_into("<L", data, header + size, 6)
    with zipfile.ZipFile(io.BytesIO(bytes(data))) as check:
        info = check.getinfo("pkg/slow.py")
        assert (info.compress_size, info.file_size) == (len(junk), 6)
    job = JobPublic.model_validate(submit(client, bytes(data)).json())
    answer = client.get(f"/v1/exports/{job.id}/uploads/model/files/pkg/slow.py")
    assert answer.status_code == 413, answer.text
    body = answer.json()
    assert (body["code"], body["details"]["limit_bytes"]) == ("upload_too_large", MAX_MEMBER_BYTES)
    assert body["details"]["size"] == len(junk)
    assert sum(reads) < MAX_MEMBER_BYTES


def test_the_index_goes_with_its_blob(client: TestClient, state: AppState) -> None:
    job = JobPublic.model_validate(
        submit(client, bloated({"pkg/net.py": NET}, "name", 3, 5)).json()
    )
    assert client.delete(f"/v1/exports/{job.id}").json()["status"] == "canceled"
    members = text("SELECT count(*) FROM zip_members")
    with state.engine.connect() as connection:
        assert connection.execute(members).scalar() == 4
    later = datetime.now(UTC) + timedelta(days=1)
    done = retention.collect(
        state.sessions, state.store, retention=timedelta(0), now=later, lease_for=timedelta(0)
    )
    assert job.id in done.expired_jobs and len(done.deleted) == 1
    with state.engine.connect() as connection:
        assert connection.execute(members).scalar() == 0


def test_members_are_read_from_the_index_on_either_database(
    any_setup: TestClient, parses: list[str]
) -> None:
    data = bloated({"pkg/net.py": NET, "pkg/deep/a.py": b"a = 1\n"}, "extra", 30, 64)
    job = JobPublic.model_validate(submit(any_setup, data).json())
    again = JobPublic.model_validate(submit(any_setup, data).json())  # the same blob
    assert again.id == job.id  # the duplicate in flight; its index is recorded once
    before = len(parses)
    base = f"/v1/exports/{job.id}/uploads/model/files"
    assert any_setup.get(f"{base}/pkg/deep/a.py").content == b"a = 1\n"
    assert any_setup.get(f"{base}/pkg\\net.py").content == NET
    assert len(parses) == before
