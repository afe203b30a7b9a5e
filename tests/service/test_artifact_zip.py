"""`GET /v1/exports/{id}/artifacts.zip` against real PostgreSQL and a local store (jobs are
finished as a worker finishes them), and the archive's streaming on a store of any size."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from persistence import retention
from persistence.lifecycle import claim, finish
from persistence.models import Artifact
from service import auth
from service.artifact_zip import MANIFEST, artifact_zip
from service.deps import AppState
from tests.service.test_auth import bearer, new_key
from tests.service.test_exports import submit
from tests.service.test_retention import age, collect
from worker.execution import store_artifacts

PROGRAM = b"PK\x03\x04" + os.urandom(3 * 1024 * 1024)
"""Three store chunks and more, incompressible, as a program is."""
GRAPH = json.dumps({"nodes": [{"op": "aten.add.Tensor", "i": i} for i in range(5000)]}).encode()


@pytest.fixture(autouse=True)
def _no_key_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(auth, "CACHE_TTL_S", 0.0)


def finish_with_artifacts(state: AppState, job_id: str, tmp_path: Path) -> dict[str, bytes]:
    """Finish a queued job as a worker does, with a program, a large JSON and a report."""
    contents = {"program.pt2": PROGRAM, "graph.json": GRAPH, "report.json": b'{"status": "ok"}'}
    out = tmp_path / job_id
    out.mkdir()
    for name, data in contents.items():
        (out / name).write_bytes(data)
    assert claim(state.sessions, job_id, "w") is not None
    stored = store_artifacts(
        state.store,
        {name: out / name for name in contents},
        2**30,
        lease=functools.partial(retention.lease, state.sessions),
    )
    assert finish(state.sessions, job_id, "w", status="succeeded", error=None, artifacts=stored)
    return contents


def test_the_zip_holds_every_artifact_with_its_size_and_digest(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    job_id = submit(client).json()["id"]
    contents = finish_with_artifacts(state, job_id, tmp_path)
    job = client.get(f"/v1/exports/{job_id}").json()

    answer = client.get(f"/v1/exports/{job_id}/artifacts.zip")

    assert answer.status_code == 200
    assert answer.headers["content-type"] == "application/zip"
    assert answer.headers["content-disposition"] == f'attachment; filename="{job_id}.zip"'
    with zipfile.ZipFile(io.BytesIO(answer.content)) as archive:
        assert archive.testzip() is None
        members = {info.filename: info for info in archive.infolist()}
        assert sorted(members) == sorted([*(a["name"] for a in job["artifacts"]), MANIFEST])
        for artifact in job["artifacts"]:
            data = archive.read(artifact["name"])
            assert len(data) == artifact["size"] == members[artifact["name"]].file_size
            assert hashlib.sha256(data).hexdigest() == artifact["sha256"]
            assert data == contents[artifact["name"]]
        # Programs are zips already: stored. JSON is deflated.
        assert members["program.pt2"].compress_type == zipfile.ZIP_STORED
        assert members["graph.json"].compress_type == zipfile.ZIP_DEFLATED
        assert members["graph.json"].compress_size < len(GRAPH) // 4
        manifest = json.loads(archive.read(MANIFEST))
    assert manifest["job_id"] == job_id
    assert manifest["artifacts"] == [
        {k: a[k] for k in ("name", "size", "sha256", "media_type")} for a in job["artifacts"]
    ]


def test_the_zip_of_another_keys_job_is_not_found(client: TestClient, state: AppState) -> None:
    alice, bob = new_key(state, "alice"), new_key(state, "bob")
    job_id = submit_as(client, alice)
    answer = client.get(f"/v1/exports/{job_id}/artifacts.zip", headers=bearer(bob))
    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"
    assert answer.json()["details"]["job_id"] == job_id
    assert client.get(f"/v1/exports/{job_id}/artifacts.zip").status_code == 401
    assert client.get("/v1/exports/nope/artifacts.zip", headers=bearer(alice)).status_code == 404


def submit_as(client: TestClient, key: Any) -> str:
    from tests.service.conftest import model_file

    answer = client.post("/v1/exports", files={"model": model_file()}, headers=bearer(key))
    assert answer.status_code == 202
    return str(answer.json()["id"])


def test_the_zip_of_an_unfinished_job_is_a_conflict(client: TestClient, state: AppState) -> None:
    job_id = submit(client).json()["id"]
    queued = client.get(f"/v1/exports/{job_id}/artifacts.zip")
    assert queued.status_code == 409
    assert queued.json()["code"] == "conflict"
    assert queued.json()["details"] == {"job_id": job_id, "status": "queued"}
    assert claim(state.sessions, job_id, "w") is not None
    running = client.get(f"/v1/exports/{job_id}/artifacts.zip")
    assert running.json()["details"]["status"] == "running"


def test_the_zip_of_an_expired_job_is_expired(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    job_id = submit(client).json()["id"]
    finish_with_artifacts(state, job_id, tmp_path)
    age(state, 25)
    assert collect(state).expired_jobs == [job_id]
    answer = client.get(f"/v1/exports/{job_id}/artifacts.zip")
    assert answer.status_code == 410
    assert answer.json()["code"] == "expired"
    assert answer.json()["details"]["job_id"] == job_id


def test_a_job_canceled_while_queued_zips_only_its_manifest(
    client: TestClient, state: AppState
) -> None:
    job_id = submit(client).json()["id"]
    assert client.delete(f"/v1/exports/{job_id}").json()["status"] == "canceled"
    answer = client.get(f"/v1/exports/{job_id}/artifacts.zip")
    assert answer.status_code == 200
    with zipfile.ZipFile(io.BytesIO(answer.content)) as archive:
        assert archive.namelist() == [MANIFEST]
        assert json.loads(archive.read(MANIFEST))["artifacts"] == []


def test_the_route_is_in_the_openapi_document(client: TestClient) -> None:
    route = client.get("/openapi.json").json()["paths"]["/v1/exports/{job_id}/artifacts.zip"]
    assert set(route["get"]["responses"]) >= {"200", "404", "409", "410"}


class _EndlessStore:
    """A store whose blobs are generated as they are read, 1 MiB at a time, noting which
    blob is open."""

    def __init__(self, sizes: dict[str, int]) -> None:
        self.sizes = sizes
        self.opened: list[str] = []

    def read(self, sha256: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        self.opened.append(sha256)
        chunk = bytes(range(256)) * 4096
        left = self.sizes[sha256]
        while left > 0:
            yield chunk[: min(left, len(chunk))]
            left -= len(chunk)


def test_the_archive_streams_blob_by_blob_in_bounded_memory() -> None:
    sizes = {"a" * 64: 256 * 2**20, "b" * 64: 2**20}
    store = _EndlessStore(sizes)
    artifacts = [
        Artifact(name="program.pt2", sha256="a" * 64, size=sizes["a" * 64], media_type="x"),
        Artifact(name="report.json", sha256="b" * 64, size=sizes["b" * 64], media_type="x"),
    ]
    stream = artifact_zip(store, "job", artifacts)  # type: ignore[arg-type]
    tracemalloc.start()
    try:
        first = next(stream)
        assert "b" * 64 not in store.opened  # a blob is opened only when the archive reaches it
        total = len(first) + sum(len(chunk) for chunk in stream)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert store.opened == ["a" * 64, "b" * 64]
    assert total > sizes["a" * 64]
    assert peak < 16 * 2**20  # 256 MiB went through; a few chunks were ever held
