"""The `weights` upload of `POST /v1/exports` takes what `torchport export` reads: a
`.pth` is accepted like a `.pt` (issue 34, item 5), against real PostgreSQL and Redis.
The API never unpickles it: the engine reads it in the sandbox with `weights_only=True`."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import model_file

STATE = b"PK\x03\x04 a torch.save zip, never opened by the API"


@pytest.mark.parametrize("name", ["tiny.pth", "tiny.PTH", "tiny.pt", "tiny.safetensors"])
def test_a_weights_file_of_each_suffix_export_reads_is_accepted(
    client: TestClient, name: str
) -> None:
    answer = client.post("/v1/exports", files={"model": model_file(), "weights": (name, STATE)})
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert job["weights_name"] == name
    served = client.get(f"/v1/exports/{job['id']}/uploads/weights")
    assert served.status_code == 200 and served.content == STATE


def test_a_weights_file_of_another_type_is_refused_naming_the_types(client: TestClient) -> None:
    answer = client.post(
        "/v1/exports", files={"model": model_file(), "weights": ("w.h5", b"\x89HDF")}
    )
    assert answer.status_code == 400
    body = answer.json()
    assert (body["code"], body["details"]["field"]) == ("invalid_request", "weights")
    assert body["details"]["allowed"] == [".safetensors", ".pt", ".pth"]
