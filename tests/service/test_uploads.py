"""Uploaded files served back (`/uploads/{field}`, `/uploads/model/files/{path}`) and the
job's file names, against real PostgreSQL and Redis."""

from __future__ import annotations

import hashlib
import io
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from persistence.store import LocalStore
from schemas import JobPublic
from service.archives import MAX_MEMBER_BYTES, MAX_ZIP_DIRECTORY_BYTES, index_stored, read_at
from service.errors import InvalidRequest
from tests.service.conftest import model_file

NET = b"import torch\n\n\nclass Net(torch.nn.Module):\n    pass\n"


def zipped(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def submit_zip(client: TestClient, data: bytes, **files: tuple[str, bytes]) -> JobPublic:
    answer = client.post("/v1/exports", files={"model": ("pkg.zip", data), **files})
    assert answer.status_code == 202, answer.text
    return JobPublic.model_validate(answer.json())


def test_a_py_upload_comes_back_as_stored_at_any_status(client: TestClient) -> None:
    name, data = model_file()
    job = JobPublic.model_validate(client.post("/v1/exports", files={"model": (name, data)}).json())
    assert job.status == "queued"
    assert (job.model_name, job.inputs_name, job.weights_name) == (name, None, None)
    answer = client.get(f"/v1/exports/{job.id}/uploads/model")
    assert answer.status_code == 200
    assert answer.content == data
    assert answer.headers["content-type"].split(";")[0] == "text/x-python"
    assert answer.headers["etag"] == f'"{hashlib.sha256(data).hexdigest()}"'
    assert answer.headers["content-length"] == str(len(data))
    assert answer.headers["x-content-type-options"] == "nosniff"
    listed = client.get("/v1/exports").json()["items"]
    assert [item["model_name"] for item in listed] == [name]


@pytest.mark.parametrize("field", ["inputs", "weights", "program", "..%2Fmodel"])
def test_an_absent_upload_is_not_found(client: TestClient, field: str) -> None:
    job_id = client.post("/v1/exports", files={"model": model_file()}).json()["id"]
    answer = client.get(f"/v1/exports/{job_id}/uploads/{field}")
    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"


def test_unknown_jobs_have_no_uploads(client: TestClient) -> None:
    for path in ("uploads/model", "uploads/model/files/pkg/net.py"):
        answer = client.get(f"/v1/exports/no-such-job/{path}")
        assert answer.status_code == 404 and answer.json()["code"] == "not_found"


def test_the_model_name_is_the_sanitized_base_name(client: TestClient) -> None:
    _, data = model_file()
    answer = client.post("/v1/exports", files={"model": ("../dir/my model!.py", data)})
    assert answer.json()["model_name"] == "my_model_.py"
    job_id = answer.json()["id"]
    disposition = client.get(f"/v1/exports/{job_id}/uploads/model").headers["content-disposition"]
    assert disposition == 'attachment; filename="my_model_.py"'


def test_zip_inputs_and_weights_come_back_with_their_types(client: TestClient) -> None:
    archive = zipped({"pkg/__init__.py": b"", "pkg/net.py": NET})
    inputs = b'{"args": [{"shape": [2], "dtype": "float32", "fill": "ones"}]}'
    weights = b"\x80\x02not really a state dict"
    job = submit_zip(client, archive, inputs=("x.json", inputs), weights=("w.pt", weights))
    assert (job.model_name, job.inputs_name, job.weights_name) == ("pkg.zip", "x.json", "w.pt")
    expected = {
        "model": (archive, "application/zip"),
        "inputs": (inputs, "application/octet-stream"),
        "weights": (weights, "application/octet-stream"),
    }
    for field, (data, media_type) in expected.items():
        answer = client.get(f"/v1/exports/{job.id}/uploads/{field}")
        assert answer.status_code == 200, field
        assert (answer.content, answer.headers["content-type"]) == (data, media_type)


def test_one_member_of_a_zip_by_its_path(client: TestClient) -> None:
    archive = zipped({"pkg/__init__.py": b"", "./pkg/net.py": NET, "pkg/w.bin": b"\0\1"})
    job = submit_zip(client, archive)
    base = f"/v1/exports/{job.id}/uploads/model/files"
    answer = client.get(f"{base}/pkg/net.py")
    assert answer.status_code == 200
    assert answer.content == NET
    assert answer.headers["content-type"].split(";")[0] == "text/x-python"
    assert answer.headers["content-disposition"] == 'attachment; filename="net.py"'
    assert answer.headers["etag"] == f'"{hashlib.sha256(NET).hexdigest()}"'
    binary = client.get(f"{base}/pkg/w.bin")
    assert (binary.content, binary.headers["content-type"]) == (b"\0\1", "application/octet-stream")
    assert client.get(f"{base}/pkg/__init__.py").content == b""


@pytest.mark.parametrize(
    "member",
    ["pkg/missing.py", "pkg", "pkg/", "net.py", "pkg/%2E%2E/pkg/net.py", "%2E%2E/etc/passwd"],
)
def test_names_not_in_the_archive_are_not_found(client: TestClient, member: str) -> None:
    job = submit_zip(client, zipped({"pkg/net.py": NET}))
    answer = client.get(f"/v1/exports/{job.id}/uploads/model/files/{member}")
    assert answer.status_code == 404
    assert answer.json()["code"] == "not_found"


def test_a_member_over_the_limit_is_refused(client: TestClient) -> None:
    big = b"# padding\n" * (MAX_MEMBER_BYTES // 10 + 1)
    job = submit_zip(client, zipped({"pkg/net.py": NET, "pkg/big.py": big}))
    answer = client.get(f"/v1/exports/{job.id}/uploads/model/files/pkg/big.py")
    assert answer.status_code == 413
    body = answer.json()
    assert body["code"] == "upload_too_large"
    assert body["details"]["limit_bytes"] == MAX_MEMBER_BYTES
    assert body["details"]["size"] == len(big)


def test_a_py_model_has_no_members(client: TestClient) -> None:
    job_id = client.post("/v1/exports", files={"model": model_file()}).json()["id"]
    answer = client.get(f"/v1/exports/{job_id}/uploads/model/files/service_small.py")
    assert answer.status_code == 404
    assert answer.json()["details"]["reason"] == "not_a_zip"


def test_a_member_header_that_understates_the_size_is_caught(tmp_path: Path) -> None:
    big = b"x" * (MAX_MEMBER_BYTES + 10)
    data = bytearray(zipped({"pkg/net.py": big}))
    # Rewrite the declared uncompressed size in both headers to 10 bytes.
    real = len(big).to_bytes(4, "little")
    assert data.count(real) == 2
    data = bytearray(bytes(data).replace(real, (10).to_bytes(4, "little")))
    path = tmp_path / "lying.zip"
    path.write_bytes(bytes(data))
    store = LocalStore(tmp_path / "store")
    sha, _ = store.put_file(path)
    where = {"job_id": "j", "member": "pkg/net.py"}
    index = index_stored(store, sha, max_directory_bytes=MAX_ZIP_DIRECTORY_BYTES, **where)
    with pytest.raises(InvalidRequest) as raised:
        read_at(store, sha, index["pkg/net.py"], "pkg/net.py", **where)
    # zipfile stops at the declared size, then finds the CRC wrong: never more bytes.
    assert raised.value.code == "invalid_request"
    assert raised.value.details["reason"] == "bad_zip"
