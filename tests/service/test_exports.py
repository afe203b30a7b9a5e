"""The /v1/exports API against real PostgreSQL and Redis (no worker: jobs are finished by
calling the same lifecycle functions a worker calls)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from persistence.lifecycle import StoredArtifact, claim, finish, record_stage
from persistence.models import Job, StageEventRow
from schemas import JobPublic
from service.deps import AppState
from tests.service.conftest import model_file


def submit(client: TestClient, model: tuple[str, bytes] | None = None, **data: str):
    files = {"model": model or model_file()}
    return client.post("/v1/exports", files=files, data=data)


def job_count(state: AppState) -> int:
    with state.sessions() as session:
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def blob_count(state: AppState) -> int:
    root = Path(state.store.url)
    return sum(1 for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def complete(state: AppState, job_id: str, tmp_path: Path, *, ok: bool = True) -> dict[str, bytes]:
    """Finish a queued job the way a worker does, with small artifacts."""
    claimed = claim(state.sessions, job_id, "test-worker")
    assert claimed is not None
    record_stage(state.sessions, job_id, "test-worker", stage="tracing", status="started")
    contents = {"program.pt2": b"PK\x03\x04" + bytes(range(256)) * 8, "report.json": b'{"a": 1}'}
    stored = []
    for name, data in contents.items():
        path = tmp_path / name
        path.write_bytes(data)
        sha, size = state.store.put_file(path)
        media = "application/json" if name.endswith(".json") else "application/zip"
        stored.append(StoredArtifact(name=name, sha256=sha, size=size, media_type=media))
    from schemas import ErrorBody

    error = None if ok else ErrorBody(code="model_not_found", message="no model")
    assert finish(
        state.sessions,
        job_id,
        "test-worker",
        status="succeeded" if ok else "failed",
        error=error,
        artifacts=stored,
    )
    return contents


def test_submit_answers_202_with_a_queued_job(client: TestClient, state: AppState) -> None:
    answer = submit(client, options=json.dumps({"strict": True}))
    assert answer.status_code == 202
    job = JobPublic.model_validate(answer.json())
    assert job.status == "queued"
    assert job.options.strict is True
    assert job.cache_hit is False
    assert [e.status for e in job.stages] == ["queued"]
    assert client.get(f"/v1/exports/{job.id}").json()["id"] == job.id
    assert job_count(state) == 1


@pytest.mark.parametrize(
    ("options", "field", "error_type"),
    [
        ({"nope": 1}, "options.nope", "extra_forbidden"),
        ({"verify": {"samples": "many"}}, "options.verify.samples", "int_parsing"),
        ({"device": "tpu"}, "options.device", "literal_error"),
        ({"timeout_s": -1}, "options.timeout_s", "greater_than"),
        ({"quantize": {"scheme": "int3"}}, "options.quantize.scheme", "literal_error"),
        ({"quantize": {"min_cosine": 1.5}}, "options.quantize.min_cosine", "less_than_equal"),
    ],
)
def test_bad_options_name_the_field_and_store_nothing(
    client: TestClient, state: AppState, options: dict, field: str, error_type: str
) -> None:
    answer = submit(client, options=json.dumps(options))
    assert answer.status_code == 400
    body = answer.json()
    assert body["code"] == "invalid_request"
    assert (field, error_type) in {(e["field"], e["type"]) for e in body["details"]["errors"]}
    assert job_count(state) == 0
    assert blob_count(state) == 0


def test_options_that_are_not_json_are_invalid(client: TestClient, state: AppState) -> None:
    answer = submit(client, options="{strict: yes")
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"
    assert answer.json()["details"]["errors"][0]["type"] == "json_invalid"


def test_missing_model_is_invalid(client: TestClient, state: AppState) -> None:
    answer = client.post("/v1/exports", files={"inputs": ("x.json", b"{}")})
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"
    assert answer.json()["details"]["field"] == "model"
    assert job_count(state) == 0


def test_a_body_that_is_not_multipart_is_invalid(client: TestClient) -> None:
    answer = client.post("/v1/exports", json={"model": "x"})
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"


def test_malformed_multipart_is_invalid_and_stores_nothing(
    client: TestClient, state: AppState
) -> None:
    body = b'--b\r\nContent-Disposition: form-data; name="model"; filename="m.py"\r\n\r\nx = 1\r\n'
    answer = client.post(
        "/v1/exports", content=body, headers={"Content-Type": "multipart/form-data; boundary=b"}
    )
    assert answer.status_code == 400
    assert answer.json()["code"] == "invalid_request"
    garbage = client.post(
        "/v1/exports",
        content=b"\x00\xff not a multipart body at all",
        headers={"Content-Type": "multipart/form-data; boundary=zzz"},
    )
    assert garbage.status_code == 400
    assert garbage.json()["code"] == "invalid_request"
    assert job_count(state) == 0
    assert blob_count(state) == 0


def test_unknown_and_repeated_form_fields_are_invalid(client: TestClient) -> None:
    unknown = client.post("/v1/exports", files={"model": model_file(), "extra": ("e.txt", b"1")})
    assert unknown.status_code == 400
    assert unknown.json()["details"]["field"] == "extra"
    repeated = client.post("/v1/exports", files=[("model", model_file()), ("model", model_file())])
    assert repeated.status_code == 400
    assert repeated.json()["details"]["field"] == "model"


def test_a_file_over_its_limit_is_refused_by_field(
    tmp_path: Path, pg_url: str, redis_prefix: str
) -> None:
    from service.app import build_state, create_app
    from tests.service.conftest import make_settings

    state = build_state(make_settings(tmp_path, pg_url, redis_prefix, max_inputs_bytes=1024))
    with TestClient(create_app(state=state), client=("127.0.0.1", 50000)) as client:
        answer = client.post(
            "/v1/exports",
            files={"model": model_file(), "inputs": ("x.json", b"[" + b"0," * 4096 + b"0]")},
        )
        assert answer.status_code == 413
        assert answer.json()["code"] == "upload_too_large"
        assert answer.json()["details"]["field"] == "inputs"
        assert answer.json()["details"]["limit_bytes"] == 1024
        assert job_count(state) == 0
        assert blob_count(state) == 0
        assert not any((tmp_path / "data" / "tmp").iterdir())


def test_non_utf8_source_and_wrong_file_types_are_invalid(client: TestClient) -> None:
    latin1 = submit(client, model=("m.py", "x = 'caf\xe9'\n".encode("latin-1")))
    assert latin1.status_code == 400
    assert latin1.json()["details"]["reason"] == "not_utf8"
    wrong = submit(client, model=("m.txt", b"model = 1\n"))
    assert wrong.status_code == 400
    assert wrong.json()["details"]["field"] == "model"
    bad_zip = submit(client, model=("m.zip", b"PK not really"))
    assert bad_zip.status_code == 400
    assert bad_zip.json()["details"]["reason"] == "bad_zip"


def test_unknown_job_ids_are_not_found_everywhere(client: TestClient) -> None:
    for method, path in [
        ("GET", "/v1/exports/nope"),
        ("DELETE", "/v1/exports/nope"),
        ("GET", "/v1/exports/nope/events"),
        ("GET", "/v1/exports/nope/artifacts/program.pt2"),
    ]:
        answer = client.request(method, path)
        assert answer.status_code == 404, path
        assert answer.json()["code"] == "not_found"


def test_artifacts_of_an_unfinished_job_are_a_conflict(client: TestClient) -> None:
    job_id = submit(client).json()["id"]
    answer = client.get(f"/v1/exports/{job_id}/artifacts/program.pt2")
    assert answer.status_code == 409
    assert answer.json()["code"] == "conflict"
    assert answer.json()["details"]["status"] == "queued"


def test_cancel_a_queued_job_then_again(client: TestClient, state: AppState) -> None:
    job_id = submit(client).json()["id"]
    first = client.delete(f"/v1/exports/{job_id}")
    assert first.status_code == 200
    assert first.json()["status"] == "canceled"
    assert first.json()["error"]["code"] == "canceled"
    again = client.delete(f"/v1/exports/{job_id}")
    assert again.status_code == 409
    assert again.json()["details"]["status"] == "canceled"
    assert claim(state.sessions, job_id, "late-worker") is None


def test_cancel_a_running_job_asks_its_worker(client: TestClient, state: AppState) -> None:
    from persistence.lifecycle import heartbeat

    job_id = submit(client).json()["id"]
    assert claim(state.sessions, job_id, "w1") is not None
    assert heartbeat(state.sessions, job_id, "w1") is False
    answer = client.delete(f"/v1/exports/{job_id}")
    assert answer.status_code == 202
    assert answer.json()["status"] == "running"
    assert heartbeat(state.sessions, job_id, "w1") is True


def test_double_submission_returns_the_job_in_flight(client: TestClient, state: AppState) -> None:
    first = submit(client).json()
    second = submit(client).json()
    assert second["id"] == first["id"]
    assert job_count(state) == 1


def test_identical_resubmission_is_a_cache_hit(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    job_id = submit(client).json()["id"]
    contents = complete(state, job_id, tmp_path)
    again = submit(client)
    assert again.status_code == 202
    hit = again.json()
    assert hit["id"] != job_id
    assert hit["cache_hit"] is True
    assert hit["status"] == "succeeded"
    original = client.get(f"/v1/exports/{job_id}").json()
    assert {a["sha256"] for a in hit["artifacts"]} == {a["sha256"] for a in original["artifacts"]}
    download = client.get(f"/v1/exports/{hit['id']}/artifacts/program.pt2")
    assert download.content == contents["program.pt2"]
    other_options = submit(client, options=json.dumps({"strict": True})).json()
    assert other_options["cache_hit"] is False


def test_failed_jobs_are_not_cached(client: TestClient, state: AppState, tmp_path: Path) -> None:
    job_id = submit(client).json()["id"]
    complete(state, job_id, tmp_path, ok=False)
    failed = client.get(f"/v1/exports/{job_id}").json()
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "model_not_found"
    again = submit(client).json()
    assert again["cache_hit"] is False
    assert again["status"] == "queued"


def test_download_streams_with_content_type_and_ranges(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    job_id = submit(client).json()["id"]
    contents = complete(state, job_id, tmp_path)
    program = contents["program.pt2"]
    url = f"/v1/exports/{job_id}/artifacts/program.pt2"
    whole = client.get(url)
    assert whole.status_code == 200
    assert whole.content == program
    assert whole.headers["content-type"] == "application/zip"
    assert whole.headers["accept-ranges"] == "bytes"
    report = client.get(f"/v1/exports/{job_id}/artifacts/report.json")
    assert report.headers["content-type"] == "application/json"
    assert report.json() == {"a": 1}
    part = client.get(url, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206
    assert part.content == program[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(program)}"
    tail = client.get(url, headers={"Range": "bytes=-5"})
    assert tail.content == program[-5:]
    beyond = client.get(url, headers={"Range": f"bytes={len(program)}-"})
    assert beyond.status_code == 416
    missing = client.get(f"/v1/exports/{job_id}/artifacts/graph.json")
    assert missing.status_code == 404
    assert missing.json()["details"]["available"] == ["program.pt2", "report.json"]


def test_events_replay_stages_and_end_with_the_job(
    client: TestClient, state: AppState, tmp_path: Path
) -> None:
    job_id = submit(client).json()["id"]
    complete(state, job_id, tmp_path)
    with client.stream("GET", f"/v1/exports/{job_id}/events") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        text = "".join(stream.iter_text())
    events = [
        (block.split("event: ")[1].split("\r\n")[0], block)
        for block in text.replace("\r\n\r\n", "\n\n").split("\n\n")
        if "event: " in block
    ]
    kinds = [kind for kind, _ in events]
    assert kinds[-1] == "job"
    assert kinds.count("stage") == 4  # queued, running, tracing started, succeeded
    final = json.loads(events[-1][1].split("data: ", 1)[1].strip())
    assert final["status"] == "succeeded"
    resumed_from = 1
    with client.stream(
        "GET", f"/v1/exports/{job_id}/events", headers={"Last-Event-ID": str(resumed_from)}
    ) as stream:
        resumed = "".join(stream.iter_text())
    assert resumed.count("event: stage") == 2


def test_list_is_paginated_newest_first_and_filtered(client: TestClient, state: AppState) -> None:
    ids = [submit(client, model=("m.py", f"model = {i}\n".encode())).json()["id"] for i in range(5)]
    client.delete(f"/v1/exports/{ids[0]}")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = client.get("/v1/exports", params=params).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    canceled = client.get("/v1/exports", params={"status": "canceled"}).json()["items"]
    assert [item["id"] for item in canceled] == [ids[0]]
    bad = client.get("/v1/exports", params={"cursor": "!!!"})
    assert bad.status_code == 400
    assert client.get("/v1/exports", params={"limit": 0}).json()["code"] == "invalid_request"


def test_events_are_recorded_in_order(client: TestClient, state: AppState, tmp_path: Path) -> None:
    job_id = submit(client).json()["id"]
    complete(state, job_id, tmp_path)
    with state.sessions() as session:
        seqs = list(
            session.scalars(
                select(StageEventRow.seq)
                .where(StageEventRow.job_id == job_id)
                .order_by(StageEventRow.id)
            )
        )
    assert seqs == sorted(seqs) == list(range(len(seqs)))


def test_cuda_jobs_go_to_the_gpu_queue(client: TestClient, state: AppState) -> None:
    cpu = submit(client).json()["id"]
    gpu = submit(client, options=json.dumps({"device": "cuda"})).json()["id"]
    with state.sessions() as session:
        queues = {job_id: session.get(Job, job_id).queue for job_id in (cpu, gpu)}  # type: ignore[union-attr]
    assert queues == {cpu: "cpu", gpu: "gpu"}
