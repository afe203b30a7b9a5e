"""Deployment targets in the pages: the form's target options reach the job, and the result
and failure pages show `report.targets`.

Jobs with targets are seeded the way a worker finishes them: submitted through the API to
the `gpu` queue (no local worker consumes it), then claimed, given stage events, artifacts
and a report.json (validated by `schemas.ReportDocument`) with the lifecycle functions.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from persistence.database import make_engine, make_session_factory
from persistence.lifecycle import StoredArtifact, claim, finish, record_stage
from persistence.records import media_type_for
from persistence.settings import CommonSettings
from persistence.store import open_store
from schemas import ErrorBody, ReportDocument
from tests.browser.conftest import MODELS, Server
from tests.browser.test_pages import SHARED_BATCH

pytestmark = pytest.mark.slow

STAGE_NAMES = ("loading", "tracing", "decomposing", "verifying", "serializing", "converting")
TARGET_FILES = {
    "program.pt2": b"PK\x03\x04 seeded program",
    "model.onnx": b"\x08\x09 seeded onnx " * 40,
    "model.pte": b"ET12 seeded pte " * 20,
}


def unique_model(tmp_path: Path) -> Path:
    """A model file no earlier job uploaded (identical submissions share one job)."""
    path = tmp_path / "seeded.py"
    path.write_text(f"# {uuid.uuid4()}\nimport torch\nmodel = torch.nn.ReLU()\n")
    return path


def output(path: str, passed: bool = True, error: float = 1e-7) -> dict[str, Any]:
    return {
        "path": path,
        "shape": [2, 4],
        "dtype": "float32",
        "max_abs_error": error,
        "max_rel_error": error * 10,
        "atol": 1e-5,
        "rtol": 1.3e-6,
        "passed": passed,
    }


def verification(samples: list[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    return {
        "enabled": True,
        "passed": all(o["passed"] for _, outs in samples for o in outs),
        "samples": [
            {
                "label": label,
                "status": "passed" if all(o["passed"] for o in outs) else "failed",
                "outputs": outs,
            }
            for label, outs in samples
        ],
    }


AOTI_ERROR: dict[str, Any] = {
    "code": "target_failed",
    "message": "aoti: the worker's CPU does not support x86-64-v4",
    "hint": "Choose a lower `aoti.isa`, e.g. portable.",
    "stage": "converting",
    "details": {"target": "aoti"},
}


def targets_report(status: str) -> dict[str, Any]:
    """The targets part of a report: onnx and executorch succeeded, aoti failed."""
    return {
        "onnx": {
            "status": "succeeded",
            "artifact": "model.onnx",
            "size": len(TARGET_FILES["model.onnx"]),
            "duration_s": 1.5,
            "verification": verification(
                [("example", [output("[0]"), output("[1]")]), ("max", [output("[0]", False, 0.5)])]
            ),
            "notes": ["ONNX Runtime does not enforce the declared min/max of a dynamic dim."],
            "details": {"opset": 18},
        },
        "aoti": {
            "status": "failed",
            "notes": [],
            "details": {"isa": "x86-64-v4"},
            "error": AOTI_ERROR,
        },
        "executorch": {
            "status": "succeeded" if status == "succeeded" else "skipped",
            "artifact": "model.pte" if status == "succeeded" else None,
            "size": len(TARGET_FILES["model.pte"]) if status == "succeeded" else None,
            "duration_s": 0.25 if status == "succeeded" else None,
            "verification": verification([("example", [output("[0]")])])
            if status == "succeeded"
            else None,
            "notes": [],
        },
    }


def seed(
    server: Server,
    tmp_path: Path,
    *,
    failed: bool,
    profile: dict[str, Any] | None = None,
    unchecked: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """A finished job with targets onnx, aoti (failed) and executorch; (id, report).

    `profile` becomes `report.profile`; `unchecked` adds report fields this version's
    schema does not know (written as they are, as a newer worker would)."""
    model = unique_model(tmp_path)
    options: dict[str, Any] = {"device": "cuda", "targets": ["executorch", "onnx", "aoti"]}
    if failed:
        options["targets_required"] = True
    answer = httpx.post(
        f"{server.url}v1/exports",
        files={"model": (model.name, model.read_bytes())},
        data={"options": json.dumps(options)},
        timeout=30,
    )
    assert answer.status_code == 202, answer.text
    job_id = str(answer.json()["id"])

    settings = CommonSettings(data_dir=server.data_dir)
    sessions = make_session_factory(make_engine(settings.resolved_database_url))
    store = open_store(settings.resolved_store_url)
    assert claim(sessions, job_id, "browser-test") is not None
    for stage in STAGE_NAMES:
        record_stage(sessions, job_id, "browser-test", stage=stage, status="started")

    status = "failed" if failed else "succeeded"
    error = {**AOTI_ERROR, "message": "target aoti failed: " + AOTI_ERROR["message"]}
    # A job failed by a required target keeps no target files, only its report.
    files = {"report.json": b""} if failed else dict(TARGET_FILES)
    report = ReportDocument.model_validate(
        {
            "status": status,
            "stages": [
                {
                    "name": stage,
                    "status": "failed" if failed and stage == "converting" else "succeeded",
                    "duration_s": 0.5,
                }
                for stage in STAGE_NAMES
            ],
            "warnings": []
            if failed
            else [
                {
                    "code": "target_failed",
                    "message": AOTI_ERROR["message"],
                    "details": {"target": "aoti"},
                }
            ],
            "error": error if failed else None,
            "targets": targets_report(status),
            "profile": profile,
            "environment": {"torchport": "0.0", "python": "3", "platform": "test"},
            "duration_s": 3.0,
        }
    )
    files["report.json"] = json.dumps(
        {**report.model_dump(mode="json"), **(unchecked or {})}
    ).encode()
    stored = []
    for name, data in files.items():
        path = tmp_path / name
        path.write_bytes(data)
        sha, size = store.put_file(path)
        stored.append(
            StoredArtifact(name=name, sha256=sha, size=size, media_type=media_type_for(name))
        )
    assert finish(
        sessions,
        job_id,
        "browser-test",
        status=status,
        error=ErrorBody.model_validate(error) if failed else None,
        artifacts=stored,
    )
    return job_id, json.loads(files["report.json"])


def test_the_form_sends_the_chosen_targets(page: Any, server: Server, tmp_path: Path) -> None:
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(unique_model(tmp_path)))
    # The ISA and the "required" box only show once they apply.
    assert page.is_hidden("#aoti-isa-row") and page.is_hidden("#targets-required")
    assert page.is_hidden("#quantize-row")
    page.check("input[data-target=onnx]")
    assert page.is_hidden("#aoti-isa-row") and page.is_visible("#targets-required")
    assert page.is_visible("#quantize-row") and page.input_value("#quantize") == "none"
    page.select_option("#quantize", "int8")
    page.check("input[data-target=aoti]")
    assert page.is_visible("#aoti-isa-row")
    assert page.input_value("#aoti-isa") == "portable"
    page.select_option("#aoti-isa", "x86-64-v2")
    page.check("#targets-required")
    page.select_option("select[name=device]", "cuda")  # the gpu queue: no local worker runs it
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/[^/]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    try:
        options = server.api(f"v1/exports/{job_id}")["options"]
        assert options["targets"] == ["onnx", "aoti"]
        assert options["targets_required"] is True
        assert options["aoti"] == {"isa": "x86-64-v2"}
        assert options["quantize"]["scheme"] == "int8"
        assert options["quantize"]["min_cosine"] == 0.99  # the default budget
        assert options["device"] == "cuda"
        # The job's progress lists the converting stage after serializing, then profiling
        # (on by default with targets).
        page.wait_for_selector("[data-stage=converting]")
        stages = page.locator("#stages li[data-stage]").evaluate_all(
            "items => items.map(i => i.dataset.stage)"
        )
        assert stages[-3:] == ["serializing", "converting", "profiling"]
    finally:
        httpx.delete(f"{server.url}v1/exports/{job_id}", timeout=10)

    # Unticked, the form sends the defaults: no targets, not required, portable.
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(unique_model(tmp_path)))
    page.select_option("select[name=device]", "cuda")
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/[^/]+$"))
    other = page.url.rsplit("/", 1)[1]
    try:
        options = server.api(f"v1/exports/{other}")["options"]
        assert options["targets"] == []
        assert options["targets_required"] is False
        assert options["aoti"] == {"isa": "portable"}
        assert options["quantize"]["scheme"] == "none"
        page.wait_for_selector("[data-stage=serializing]")
        assert page.locator("[data-stage=converting]").count() == 0
        assert page.locator("[data-stage=profiling]").count() == 0
    finally:
        httpx.delete(f"{server.url}v1/exports/{other}", timeout=10)


def submitted_job(page: Any, server: Server) -> dict[str, Any]:
    """Submit the form and wait for the job page: the job as the API has it."""
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/[^/]+$"))
    return server.api(f"v1/exports/{page.url.rsplit('/', 1)[1]}")


def test_the_form_sends_a_calibration_file_only_with_int8(
    page: Any, server: Server, tmp_path: Path
) -> None:
    # Two samples for the seeded model, a ReLU: any float tensor fits it (its outputs are
    # [2, 4] in the seeded reports). The job goes to the gpu queue, where nothing runs it.
    calibration = tmp_path / "calib.json"
    calibration.write_bytes(json.dumps([{"args": [{"shape": [2, 4]}]}] * 2).encode())
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(unique_model(tmp_path)))
    page.select_option("select[name=device]", "cuda")
    assert page.is_hidden("#calibration-row")
    page.check("input[data-target=executorch]")
    assert page.is_hidden("#calibration-row")  # scheme none
    page.select_option("#quantize", "int8")
    assert page.is_visible("#calibration-row")
    field = "[data-testid=file-calibration]"
    assert page.get_attribute(field, "accept") == ".safetensors,.pt,.json"
    page.select_option("#quantize", "int8_dynamic")
    assert page.is_hidden("#calibration-row")
    page.select_option("#quantize", "int8")
    page.set_input_files(field, str(calibration))
    assert page.locator("[data-zone=calibration] .file-name").text_content() == "calib.json"

    # The same size check as the other files, against the server's `calibration` limit.
    limits = json.loads(page.get_attribute("meta[name=torchport-limits]", "content") or "{}")
    assert limits["calibration"] == 512 * 2**20
    page.evaluate(
        "n => { const m = document.querySelector('meta[name=torchport-limits]');"
        " m.content = JSON.stringify({...JSON.parse(m.content), calibration: n}) }",
        calibration.stat().st_size - 1,
    )
    before = len(server.api("v1/exports?limit=100")["items"])
    page.click("#submit")
    codes = page.locator("#form-errors li").evaluate_all(
        "items => items.map(i => [i.dataset.field, i.dataset.code])"
    )
    assert codes == [["calibration", "upload_too_large"]]
    assert len(server.api("v1/exports?limit=100")["items"]) == before
    page.evaluate(
        "n => { const m = document.querySelector('meta[name=torchport-limits]');"
        " m.content = JSON.stringify({...JSON.parse(m.content), calibration: n}) }",
        limits["calibration"],
    )

    job = submitted_job(page, server)
    try:
        assert job["options"]["quantize"]["scheme"] == "int8"
        assert job["calibration_name"] == "calib.json"
        served = httpx.get(f"{server.url}v1/exports/{job['id']}/uploads/calibration", timeout=10)
        assert served.status_code == 200 and served.content == calibration.read_bytes()
        fact = page.locator("[data-fact=quantize]")
        assert fact.get_attribute("data-calibration") == "calib.json"
    finally:
        httpx.delete(f"{server.url}v1/exports/{job['id']}", timeout=10)

    # Attached, then int8_dynamic: the file is not sent (the API would refuse it).
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(unique_model(tmp_path)))
    page.select_option("select[name=device]", "cuda")
    page.check("input[data-target=executorch]")
    page.select_option("#quantize", "int8")
    page.set_input_files(field, str(calibration))
    page.select_option("#quantize", "int8_dynamic")
    job = submitted_job(page, server)
    try:
        assert job["options"]["quantize"]["scheme"] == "int8_dynamic"
        assert job["calibration_name"] is None
        served = httpx.get(f"{server.url}v1/exports/{job['id']}/uploads/calibration", timeout=10)
        assert served.status_code == 404
    finally:
        httpx.delete(f"{server.url}v1/exports/{job['id']}", timeout=10)


def test_the_result_page_shows_each_target(page: Any, server: Server, tmp_path: Path) -> None:
    job_id, report = seed(server, tmp_path, failed=False)
    page.goto(f"/#/jobs/{job_id}")
    card = page.locator("[data-card=deployment-targets]")
    card.wait_for()
    assert page.get_attribute("[data-stage=converting]", "data-state") == "done"

    rows = card.locator("tr[data-target]").evaluate_all(
        "rows => rows.map(r => [r.dataset.target, r.dataset.status])"
    )
    assert rows == [
        [name, report["targets"][name]["status"]] for name in ("onnx", "aoti", "executorch")
    ]

    for name in ("onnx", "executorch"):
        target = report["targets"][name]
        link = card.locator(f"tr[data-target={name}] a[data-artifact-link]")
        assert link.get_attribute("data-artifact-link") == target["artifact"]
        href = link.get_attribute("href")
        assert href == f"v1/exports/{job_id}/artifacts/{target['artifact']}"
        assert (
            httpx.get(server.url + str(href), timeout=10).content
            == TARGET_FILES[target["artifact"]]
        )
        size = page.evaluate(
            "async (n) => (await import('./web/dom.js')).formatBytes(n)", target["size"]
        )
        assert card.locator(f"tr[data-target={name}] [data-field=size]").text_content() == size
        # Each target's verification table: one row per sample output, verdicts as reported.
        verdicts = card.locator(
            f"[data-target-detail={name}] table.verification tr[data-output]"
        ).evaluate_all("rows => rows.map(r => [r.dataset.sample, r.dataset.output, r.className])")
        assert verdicts == [
            [s["label"], o["path"], "verdict-passed" if o["passed"] else "verdict-failed"]
            for s in target["verification"]["samples"]
            for o in s["outputs"]
        ]
        # The artifact is also among the downloads, and the button gives its bytes.
        with page.expect_download() as download_info:
            page.click(f"[data-card=downloads] [data-artifact='{target['artifact']}']")
        assert Path(download_info.value.path()).read_bytes() == TARGET_FILES[target["artifact"]]

    # The link downloads the artifact too.
    with page.expect_download() as download_info:
        card.locator("tr[data-target=onnx] a[data-artifact-link]").click()
    assert Path(download_info.value.path()).read_bytes() == TARGET_FILES["model.onnx"]

    # The failed target: no link, its error as a warning, and the report's warning.
    assert card.locator("tr[data-target=aoti] a").count() == 0
    warning = card.locator("[data-target-detail=aoti] [data-code=target_failed]")
    assert warning.count() == 1 and warning.get_attribute("data-target") == "aoti"
    assert card.locator("[data-target-detail=aoti] table.verification").count() == 0
    assert page.locator("[data-card=warnings] li[data-code=target_failed]").count() == 1
    assert card.locator("[data-code=target_failed]").count() == 1


def test_a_required_target_that_failed_fails_the_job(
    page: Any, server: Server, tmp_path: Path
) -> None:
    job_id, report = seed(server, tmp_path, failed=True)
    page.goto(f"/#/jobs/{job_id}")
    page.wait_for_selector("#error-code")
    assert page.get_attribute("#error-code", "data-code") == "target_failed"
    assert page.get_attribute("[data-stage=converting]", "data-state") == "failed"
    assert page.get_attribute("[data-stage=serializing]", "data-state") == "done"
    assert page.locator("[data-card=export-failed] .explain").count() == 1
    card = page.locator("[data-card=deployment-targets]")
    rows = card.locator("tr[data-target]").evaluate_all(
        "rows => rows.map(r => [r.dataset.target, r.dataset.status])"
    )
    assert rows == [
        [name, report["targets"][name]["status"]] for name in ("onnx", "aoti", "executorch")
    ]
    # This seeded failed job kept no target files, so nothing links to one.
    assert card.locator("a[data-artifact-link]").count() == 0
    assert card.locator("[data-target-detail=aoti] [data-code=target_failed]").count() == 1

    # Export again without `targets_required`: the form keeps the targets.
    page.click("#reexport-optional-targets")
    page.wait_for_selector("#upload-form")
    checked = page.locator("input[data-target]").evaluate_all(
        "boxes => boxes.filter(b => b.checked).map(b => b.value)"
    )
    assert checked == ["onnx", "aoti", "executorch"]
    assert not page.is_checked("#targets-required")
    assert page.input_value("select[name=device]") == "cuda"


def test_a_real_onnx_target_shows_its_verification(page: Any, server: Server) -> None:
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(MODELS / "shared_batch.py"))
    page.fill("#dynamic-shapes", json.dumps(SHARED_BATCH))
    page.check("input[data-target=onnx]")
    page.click("#submit")
    page.wait_for_url(re.compile(r"#/jobs/[^/]+$"))
    job_id = page.url.rsplit("/", 1)[1]
    card = page.locator("[data-card=deployment-targets]")
    card.wait_for(timeout=300_000)
    assert page.get_attribute("[data-stage=converting]", "data-state") == "done"
    onnx = server.api(f"v1/exports/{job_id}/artifacts/report.json")["targets"]["onnx"]
    assert onnx["status"] == "succeeded"
    row = card.locator("tr[data-target=onnx]")
    assert row.get_attribute("data-status") == "succeeded"
    href = row.locator("a[data-artifact-link]").get_attribute("href")
    assert href == f"v1/exports/{job_id}/artifacts/{onnx['artifact']}"
    names = [a["name"] for a in server.api(f"v1/exports/{job_id}")["artifacts"]]
    assert onnx["artifact"] in names
    rows = card.locator("[data-target-detail=onnx] table.verification tr[data-output]")
    assert rows.count() == sum(len(s["outputs"]) for s in onnx["verification"]["samples"]) > 0
