"""End to end through real processes: API (uvicorn), Celery worker, sandbox, PostgreSQL,
Redis. Faults: a worker killed mid-job, cancel of a running job."""

from __future__ import annotations

import json
import zipfile
from io import BytesIO
from pathlib import Path

import pytest

from schemas import GraphDocument, ReportDocument, SignatureDocument
from tests.integration.conftest import Stack, slow_model
from tests.service.conftest import MODELS

pytestmark = pytest.mark.slow


def test_submit_export_download_and_cache_hit(stack: Stack) -> None:
    job = stack.submit(MODELS / "service_small.py")
    done = stack.wait_done(job["id"])
    assert done["status"] == "succeeded", done["error"]
    assert sorted(a["name"] for a in done["artifacts"]) == [
        "graph.json",
        "program.pt2",
        "report.json",
        "signature.json",
    ]
    stages = [e["stage"] for e in done["stages"] if e["stage"]]
    assert stages[0] == "loading" and "tracing" in stages
    program = stack.http.get(f"/v1/exports/{job['id']}/artifacts/program.pt2")
    assert program.headers["content-type"] == "application/zip"
    assert zipfile.is_zipfile(BytesIO(program.content))
    sha = next(a["sha256"] for a in done["artifacts"] if a["name"] == "program.pt2")
    import hashlib

    assert hashlib.sha256(program.content).hexdigest() == sha
    report = ReportDocument.model_validate_json(
        stack.http.get(f"/v1/exports/{job['id']}/artifacts/report.json").content
    )
    assert report.status == "succeeded"
    GraphDocument.model_validate_json(
        stack.http.get(f"/v1/exports/{job['id']}/artifacts/graph.json").content
    )
    SignatureDocument.model_validate_json(
        stack.http.get(f"/v1/exports/{job['id']}/artifacts/signature.json").content
    )
    again = stack.submit(MODELS / "service_small.py")
    assert again["cache_hit"] is True
    assert again["status"] == "succeeded"


def test_a_failing_model_fails_with_its_code_and_a_report(stack: Stack) -> None:
    job = stack.submit(MODELS / "load_no_model.py")
    done = stack.wait_done(job["id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == "model_not_found"
    report = stack.http.get(f"/v1/exports/{job['id']}/artifacts/report.json").json()
    assert report["status"] == "failed"
    assert report["error"]["code"] == "model_not_found"


def test_events_stream_follows_a_job_to_the_end(stack: Stack, tmp_path: Path) -> None:
    model = tmp_path / "events_model.py"
    model.write_bytes((MODELS / "service_small.py").read_bytes() + b"\n# events\n")
    job = stack.submit(model)
    with stack.http.stream("GET", f"/v1/exports/{job['id']}/events", timeout=120) as stream:
        text = "".join(stream.iter_text())
    blocks = [b for b in text.replace("\r\n", "\n").split("\n\n") if "event:" in b]
    assert blocks[-1].startswith("event: job")
    final = json.loads(blocks[-1].split("data: ", 1)[1])
    assert final["status"] == "succeeded"


def test_cancel_kills_a_running_job(stack: Stack, tmp_path: Path) -> None:
    job = stack.submit(slow_model(tmp_path, 60))
    stack.wait_running(job["id"])
    answer = stack.http.delete(f"/v1/exports/{job['id']}")
    assert answer.status_code == 202
    done = stack.wait_done(job["id"], timeout=20)
    assert done["status"] == "canceled"
    assert done["error"]["code"] == "canceled"


def test_a_worker_killed_mid_job_loses_no_job(stack: Stack, tmp_path: Path) -> None:
    job = stack.submit(slow_model(tmp_path, 3))
    running = stack.wait_running(job["id"])
    assert running["attempts"] == 1
    stack.kill_worker(stack.workers[-1])
    stack.start_worker()
    done = stack.wait_done(job["id"], timeout=120)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2
    assert "worker_lost" in [e["message"] for e in done["stages"]]


def test_deployment_targets_through_rest(stack: Stack) -> None:
    pytest.importorskip("onnxruntime", reason="the `targets` extra is not installed")
    import onnx

    job = stack.submit(MODELS / "service_small.py", targets=["onnx"])
    done = stack.wait_done(job["id"], timeout=240)
    assert done["status"] == "succeeded", done["error"]
    listed = {a["name"]: a for a in done["artifacts"]}
    assert "model.onnx" in listed
    model = stack.http.get(f"/v1/exports/{job['id']}/artifacts/model.onnx")
    assert model.status_code == 200
    import hashlib

    assert hashlib.sha256(model.content).hexdigest() == listed["model.onnx"]["sha256"]
    onnx.checker.check_model(onnx.load_from_string(model.content))
    report = ReportDocument.model_validate_json(
        stack.http.get(f"/v1/exports/{job['id']}/artifacts/report.json").content
    )
    onnx_result = report.targets["onnx"]
    assert onnx_result.status == "succeeded"
    assert onnx_result.verification is not None and onnx_result.verification.passed
