"""The content-addressed store only holds copies owned by the service, mode 0644.

Found by an attack run: a program over 64 MiB (which the sandbox does not copy early) was
hard-linked into the store with the job's uid and the mode the job chose (02777), and
identical content uploaded later reused that inode.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from persistence.store import LocalStore
from service.deps import AppState
from worker.execution import store_artifacts

JOB_UID = 65534


def _job_output(path: Path, data: bytes) -> Path:
    """A file as a job leaves it: its own uid where we can give it one, mode 02777."""
    path.write_bytes(data)
    if os.geteuid() == 0:
        os.chown(path, JOB_UID, JOB_UID)
    os.chmod(path, 0o2777)
    return path


def _assert_sound(blob: Path, source: Path) -> None:
    info = blob.stat()
    assert stat.S_IMODE(info.st_mode) == 0o644
    assert info.st_uid == os.geteuid()
    assert info.st_ino != source.stat().st_ino


def test_a_large_program_is_copied_into_the_store(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = os.urandom(1024) * (65 * 1024)  # 65 MiB
    program = _job_output(tmp_path / "program.pt2", data)
    leased: dict[str, int | None] = {}
    (stored,) = store_artifacts(
        store, {"program.pt2": program}, max_bytes=2**40, lease=leased.update
    )
    assert leased == {stored.sha256: len(data)}
    blob = store.local_path(stored.sha256)
    _assert_sound(blob, program)
    assert stored.size == len(data)
    # The job's file can change afterwards; the blob cannot.
    with program.open("r+b") as f:
        f.write(b"changed")
    assert blob.read_bytes()[:7] == data[:7]


def test_identical_content_later_does_not_reuse_a_bad_inode(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    data = b"the same bytes" * 1000
    first = _job_output(tmp_path / "first.pt2", data)
    sha256, _ = store.put_file(first)
    blob = store.local_path(sha256)
    # A blob an older version linked in: the job's inode, its uid and mode.
    blob.unlink()
    os.link(first, blob)
    second = tmp_path / "second.pt2"
    second.write_bytes(data)
    assert store.put_file(second) == (sha256, len(data))
    _assert_sound(blob, first)
    _assert_sound(blob, second)


def test_a_symlink_or_fifo_is_not_stored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the job's")
    link = tmp_path / "link.pt2"
    link.symlink_to(secret)
    fifo = tmp_path / "fifo.pt2"
    os.mkfifo(fifo)
    from persistence.store import StoreError

    for path in (link, fifo):
        with pytest.raises(StoreError):
            store.put_file(path)


def test_uploads_are_stored_0644_owned_by_the_service(client: TestClient, state: AppState) -> None:
    answer = client.post("/v1/exports", files={"model": ("model.py", b"model = None\n")})
    assert answer.status_code == 202
    with state.sessions() as session:
        from persistence.models import Job

        job = session.get(Job, answer.json()["id"])
        assert job is not None
        sha256 = job.model_sha256
    assert isinstance(state.store, LocalStore)
    info = state.store.local_path(sha256).stat()
    assert stat.S_IMODE(info.st_mode) == 0o644
    assert info.st_uid == os.geteuid()
    assert info.st_nlink == 1  # the received temporary file is gone
