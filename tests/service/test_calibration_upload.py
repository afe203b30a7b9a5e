"""The `calibration` upload of `POST /v1/exports` (quantize.scheme int8): accepted with
int8 only, stored, served back, named in the job, and part of the job's identity, against
real PostgreSQL and Redis."""

from __future__ import annotations

import json
from pathlib import Path

from fastapi.testclient import TestClient
from sqlalchemy import func, select

from persistence.models import Job
from service.deps import AppState
from tests.service.conftest import model_file

INT8 = json.dumps({"targets": ["onnx"], "quantize": {"scheme": "int8"}})
SAMPLES = b'[{"args": [{"shape": [2, 4]}]}, {"args": [{"shape": [3, 4]}]}]'


def post(client: TestClient, calibration: tuple[str, bytes] | None, options: str = INT8):
    files = {"model": model_file()}
    if calibration is not None:
        files["calibration"] = calibration
    return client.post("/v1/exports", files=files, data={"options": options})


def job_count(state: AppState) -> int:
    with state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def test_a_calibration_file_is_stored_named_and_served_back(client: TestClient) -> None:
    answer = post(client, ("calib.json", SAMPLES))
    assert answer.status_code == 202, answer.text
    job = answer.json()
    assert job["calibration_name"] == "calib.json"
    served = client.get(f"/v1/exports/{job['id']}/uploads/calibration")
    assert served.status_code == 200 and served.content == SAMPLES
    listed = client.get("/v1/exports").json()["items"]
    assert [item["calibration_name"] for item in listed] == ["calib.json"]


def test_another_calibration_is_another_job_the_same_one_is_not(
    client: TestClient, state: AppState
) -> None:
    first = post(client, ("a.json", SAMPLES)).json()
    same = post(client, ("b.json", SAMPLES)).json()
    other = post(client, ("a.json", SAMPLES.replace(b"[3, 4]", b"[4, 4]"))).json()
    without = post(client, None).json()
    assert same["id"] == first["id"]  # the same bytes in flight: one job
    assert len({first["id"], other["id"], without["id"]}) == 3
    assert job_count(state) == 3


def test_a_calibration_file_with_another_scheme_is_refused(
    client: TestClient, state: AppState
) -> None:
    for options in (json.dumps({"quantize": {"scheme": "int8_dynamic"}}), "{}"):
        answer = post(client, ("calib.json", SAMPLES), options)
        assert answer.status_code == 400
        body = answer.json()
        assert body["code"] == "invalid_request"
        assert body["details"]["field"] == "calibration"
        assert body["details"]["reason"] == "calibration_unused"
    assert job_count(state) == 0


def test_a_calibration_file_of_another_type_is_refused(client: TestClient, state: AppState) -> None:
    answer = post(client, ("calib.npy", b"\x93NUMPY"))
    assert answer.status_code == 400
    assert answer.json()["details"]["field"] == "calibration"
    assert answer.json()["details"]["allowed"] == [".safetensors", ".pt", ".json"]
    assert job_count(state) == 0


def test_a_calibration_file_over_its_limit_is_refused(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    from service.app import build_state, create_app
    from tests.service.conftest import make_settings

    settings = make_settings(tmp_path, pg_url, redis_prefix, max_calibration_bytes=1024)
    state = build_state(settings)
    with TestClient(create_app(state=state), client=("127.0.0.1", 50000)) as client:
        answer = post(client, ("calib.json", b"[" + b"{}," * 1024 + b"{}]"))
        assert answer.status_code == 413
        body = answer.json()
        assert body["code"] == "upload_too_large"
        assert (body["details"]["field"], body["details"]["limit_bytes"]) == ("calibration", 1024)
        assert job_count(state) == 0
    state.engine.dispose()
