"""`torchport serve`, `submit`, `keys` and the Python client, as users run them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest import free_port
from tests.integration.test_service_faults import Serve
from tests.service.conftest import MODELS, ROOT
from torchport.client import Client, TorchportError

pytestmark = pytest.mark.slow


def torchport(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    tmp = tmp_path_factory.mktemp("serve")
    running = Serve(tmp / "data", free_port(), tmp / "serve.log")
    yield running
    assert running.stop() == 0


def test_submit_waits_and_downloads(server: Serve, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = torchport(
        "submit",
        str(MODELS / "service_small.py"),
        "--server",
        server.url,
        "--out",
        str(out),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    job = json.loads(done.stdout)
    assert job["status"] == "succeeded"
    assert sorted(p.name for p in out.iterdir()) == [
        "graph.json",
        "program.pt2",
        "report.json",
        "signature.json",
    ]
    assert zipfile.is_zipfile(out / "program.pt2")


def test_submit_exit_codes(server: Serve, tmp_path: Path) -> None:
    failed = torchport(
        "submit", str(MODELS / "load_no_model.py"), "--server", server.url, "--wait", "--json"
    )
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["error"]["code"] == "model_not_found"
    refused = torchport(
        "submit",
        str(MODELS / "service_small.py"),
        "--server",
        server.url,
        "--options",
        '{"nope": 1}',
        "--json",
    )
    assert refused.returncode == 2
    assert json.loads(refused.stdout)["code"] == "invalid_request"
    queued = torchport("submit", str(MODELS / "load_function.py"), "--server", server.url)
    assert queued.returncode == 0


def test_submit_prints_what_export_prints(server: Serve, tmp_path: Path) -> None:
    """The summary of the job's report.json: its stages and artifacts on success; its
    error with the upload's line and the hint on failure."""
    done = torchport("submit", str(MODELS / "load_instance.py"), "--server", server.url, "--wait")
    assert done.returncode == 0, done.stderr
    job_id, status = done.stdout.split()[:2]
    assert status == "succeeded"
    with Client(server.url) as client:
        report = client.job(job_id).download(tmp_path / "report", names=["report.json"])[0]
    stages = [stage["name"] for stage in json.loads(report.read_text())["stages"]]
    assert stages and all(stage in done.stdout for stage in stages)
    assert "program.pt2" in done.stdout and "signature.json" in done.stdout

    out = tmp_path / "out"
    failed = torchport(
        "submit", str(MODELS / "diag_data_dependent.py"), "--server", server.url, "--out", str(out)
    )
    assert failed.returncode == 1
    job_id = failed.stdout.split()[0]
    with Client(server.url) as client:
        error = client.job(job_id).error
    assert error is not None and error.location is not None and error.hint
    assert error.code in failed.stdout
    assert f"{error.location.file}:{error.location.line}" in failed.stdout
    assert (out / "report.json").is_file()


def test_submit_with_calibration_through_the_worker(server: Serve, tmp_path: Path) -> None:
    """`--calibration` travels as the `calibration` field, is stored, and reaches the
    sandboxed job beside an inputs file of the same name; `int8` is calibrated on it."""
    import safetensors.torch
    import torch

    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    inputs = tmp_path / "a" / "data.safetensors"
    safetensors.torch.save_file({"args.0": torch.randn(3, 3, 32, 32)}, str(inputs))
    calibration = tmp_path / "b" / "data.safetensors"
    samples = {f"{n}.args.0": torch.randn(2, 3, 32, 32) for n in range(4)}
    safetensors.torch.save_file(samples, str(calibration))
    out = tmp_path / "out"
    done = torchport(
        "submit",
        str(MODELS / "quant_cnn.py"),
        "--inputs",
        str(inputs),
        "--calibration",
        str(calibration),
        "--target",
        "onnx",
        "--quantize",
        "int8",
        "--no-profile",
        "--server",
        server.url,
        "--out",
        str(out),
        "--json",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job = json.loads(done.stdout)
    assert (job["inputs_name"], job["calibration_name"]) == ("data.safetensors",) * 2
    report = json.loads((out / "report.json").read_text())
    assert [leaf["shape"] for leaf in report["inputs"]] == [[3, 3, 32, 32]]
    quantization = report["quantization"]
    assert (quantization["calibration_source"], quantization["calibration_samples"]) == (
        "upload",
        4,
    )
    assert report["targets"]["onnx"]["status"] == "succeeded"
    with Client(server.url) as client:
        stored = client._send("GET", f"/v1/exports/{job['id']}/uploads/calibration")
    assert stored.content == calibration.read_bytes()


def test_python_client(server: Serve, tmp_path: Path) -> None:
    with Client(server.url) as client:
        model = tmp_path / "client_model.py"
        model.write_bytes((MODELS / "service_small.py").read_bytes() + b"\n# client\n")
        job = client.submit(model, options={"verify": {"samples": 1}})
        seen: list[str] = []
        job.wait(timeout=120, on_event=lambda e: seen.append(e.status))
        assert job.status == "succeeded"
        assert "running" in seen
        paths = job.download(tmp_path / "dl", names=["program.pt2"])
        assert [p.name for p in paths] == ["program.pt2"]
        every = job.download(tmp_path / "all")
        assert sorted(p.name for p in every) == sorted(a.name for a in job.data.artifacts)
        archive = job.download_zip(tmp_path)
        with zipfile.ZipFile(archive) as zf:
            assert set(zf.namelist()) == {*(p.name for p in every), "manifest.json"}
        assert [j.id for j in client.list(status="succeeded", limit=1).items] == [job.id]
        assert client.get(job.id).status == "succeeded"
        assert client.job(job.id).data.cache_hit is False
        assert job.id in [j.id for j in client.jobs(status="succeeded")]
        with pytest.raises(TorchportError) as info:
            client.job("no-such-job")
        assert (info.value.code, info.value.status_code) == ("not_found", 404)


def test_keys_and_the_loopback_rule(tmp_path: Path) -> None:
    data = tmp_path / "data"
    refused = torchport(
        "serve", "--host", "0.0.0.0", "--port", str(free_port()), "--data-dir", str(data)
    )
    assert refused.returncode == 2
    created = torchport("keys", "--data-dir", str(data), "--json", "create", "ci")
    assert created.returncode == 0, created.stderr
    key = json.loads(created.stdout)
    assert key["key"].startswith("tp_")
    listed = json.loads(torchport("keys", "--data-dir", str(data), "--json", "list").stdout)
    assert [(k["id"], k["revoked"]) for k in listed] == [(key["id"], False)]
    assert torchport("keys", "--data-dir", str(data), "revoke", key["id"]).returncode == 0
    assert torchport("keys", "--data-dir", str(data), "revoke", "nope").returncode == 1
    listed = json.loads(torchport("keys", "--data-dir", str(data), "--json", "list").stdout)
    assert listed[0]["revoked"] is True
