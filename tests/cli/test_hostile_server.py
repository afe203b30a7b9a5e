"""What a hostile torchport server sends, and what the CLI makes of it (issue 33, items 9
and 11).

A small HTTP server here answers as a torchport server would, with every string it can
(job ids, stage messages, errors, report and signature fields, artifact names, the
workers' environment, error answers) replaced by terminal escape sequences — a window
title, an OSC 52 clipboard write, a screen clear, a hyperlink, a C1 CSI, DEL, NUL, bidi
overrides, a lone surrogate — and rich markup. The CLI, run as a pipeline runs it, shows
them as escapes and never runs them. A downloaded `artifacts.zip` naming a member that is
empty, absolute, `..`, with a backslash, a NUL or a control character is refused: exit 2
and an error body, never a traceback, and nothing is written."""

from __future__ import annotations

import copy
import io
import json
import os
import re
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Collection, Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from schemas import (
    ArtifactProfile,
    EncoderReport,
    Environment,
    ErrorBody,
    GenerationCheck,
    GenerationReport,
    JobPublic,
    LatencyProfile,
    MachineProfile,
    OutputCheck,
    ProfileReport,
    ReportDocument,
    RoundtripCheck,
    SampleCheck,
    SignatureDocument,
    SourceLocation,
    StageEvent,
    TargetResult,
    VerificationReport,
)
from schemas.environment import (
    EnvironmentDescription,
    EnvironmentList,
    LibraryInfo,
    TargetSupport,
    WorkerEnvironment,
)
from schemas.job import ArtifactRef, JobList, JobSummary, WebhookDelivery
from schemas.options import SubmittedOptions
from schemas.report import (
    ArtifactInfo,
    DecompositionReport,
    DraftIssue,
    DynamicShapeFix,
    DynamicShapesReport,
    ReportWarning,
    SandboxReport,
    StageRecord,
    TraceAttempt,
    TracingReport,
)
from tests.service.conftest import MODELS, ROOT

MARKUP = "[link=http://evil.example/]markup[/link][blink]b[/blink]"
PAYLOAD = (
    "\x1b]0;TITLE\x07"  # window title
    "\x1b]52;c;Y3VybCBldmls\x07"  # OSC 52: write the clipboard
    "\x1b[2J\x1b[H"  # clear the screen
    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # a hyperlink
    "\x9b31m\x7f\x00\r\t\n"  # C1 CSI, DEL, NUL, carriage return, tab, newline
    "\u202eevil\u2066\u200b\ud800" + MARKUP  # bidi override and isolate, zero width, lone surrogate
)
SHOWN = ("\\x1b]52;c;", "\\x9b", "\\u202e", "\\ud800", MARKUP)
"""What of the payload the output must show (escaped, or the markup as text)."""
UNSAFE = re.compile(
    "[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff\ud800-\udfff]"
)
"""Anything a terminal runs or draws invisibly; a newline alone may pass."""
AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def hostile(document: Any, model: type[BaseModel], keep: Collection[str] = ()) -> Any:
    """`document` (JSON data `model` accepts) with every string value, and every key of its
    free-form objects, replaced by the payload, one at a time, wherever `model` still
    accepts the result; the fields named in `keep` stay."""
    doc = copy.deepcopy(document)
    count = iter(range(10**6))

    def valid() -> bool:
        try:
            model.model_validate(doc)
        except ValidationError:
            return False
        return True

    def walk(node: Any) -> None:
        slots = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, value in slots:
            if key in keep:
                continue
            if isinstance(value, str):
                node[key] = PAYLOAD
                if not valid():
                    node[key] = value
            elif isinstance(value, dict | list):
                walk(value)
        if isinstance(node, dict):
            for key in [k for k in node if k not in keep]:
                renamed = f"{PAYLOAD}{next(count)}"
                node[renamed] = node.pop(key)
                if not valid():
                    node[key] = node.pop(renamed)

    walk(doc)
    return doc


def dumps(document: Any) -> bytes:
    return json.dumps(document).encode()  # lone surrogates travel as \ud800 escapes


Route = tuple[int, str, bytes]


class HostileServer:
    """Answers by the end of the path (the job id in it is whatever the CLI asked for)."""

    def __init__(self) -> None:
        self.routes: dict[tuple[str, str], Route] = {}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def answer(self, method: str, suffix: str, body: bytes, status: int = 200, **kw: str) -> None:
        self.routes[(method, suffix)] = (status, kw.get("content_type", "application/json"), body)

    def _route(self, method: str, path: str) -> Route:
        path = path.split("?")[0]
        for (wanted, suffix), route in sorted(self.routes.items(), key=lambda r: -len(r[0][1])):
            if wanted == method and path.endswith(suffix):
                return route
        return 404, "application/json", b'{"code": "not_found", "message": "no"}'

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def _reply(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                status, content_type, body = server._route(method, self.path)
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._reply("GET")

            def do_POST(self) -> None:
                self._reply("POST")

            def do_DELETE(self) -> None:
                self._reply("DELETE")

            def log_message(self, *args: object) -> None:
                pass

        return Handler


@pytest.fixture
def evil() -> Iterator[HostileServer]:
    server = HostileServer()
    thread = threading.Thread(target=server.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.httpd.shutdown()
        server.httpd.server_close()


def torchport(server: HostileServer, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as a pipeline runs it, wide enough that rich wraps nothing."""
    env = {**os.environ, "TORCHPORT_SERVER": server.url, "TORCHPORT_API_KEY": "tp_x"}
    env["COLUMNS"] = "4000"
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", *args],
        cwd=ROOT,
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=120,
        env=env,
    )


def assert_shown_safely(done: subprocess.CompletedProcess[str]) -> None:
    """No traceback, nothing a terminal would run, and the payload shown as escapes."""
    both = done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert UNSAFE.findall(both) == []
    for shown in SHOWN:
        assert shown in both


def job_document(status: str = "failed", names: Collection[str] = ("report.json",)) -> Any:
    error = ErrorBody(
        code="data_dependent",
        message="m",
        hint="h",
        stage="tracing",
        location=SourceLocation(file="model.py", line=3, code="if x:"),
        details={"reason": "r"},
        exportdb=["cond_branch"],
    )
    return JobPublic(
        id="j1",
        status=status,  # type: ignore[arg-type]
        stage="tracing",
        stages=[
            StageEvent(status="queued", at=AT, message="q"),
            StageEvent(stage="loading", status="progress", at=AT, fraction=0.5, message="p"),
            StageEvent(status=status, at=AT, message="e"),  # type: ignore[arg-type]
        ],
        options=SubmittedOptions(),
        error=error if status == "failed" else None,
        artifacts=[ArtifactRef(name=n, size=2, sha256="a" * 64, media_type="x") for n in names],
        created_at=AT,
        started_at=AT,
        finished_at=AT,
        webhook=WebhookDelivery(status="failed", last_error="w"),
        model_name="model.py",
        inputs_name="inputs.json",
        weights_name="weights.pt",
        calibration_name="calibration.json",
    ).model_dump(mode="json")


def _verification() -> VerificationReport:
    output = OutputCheck(path="[0]", dtype="float32", max_abs_error=0.0, passed=True, message="o")
    return VerificationReport(
        enabled=True,
        passed=True,
        samples=[
            SampleCheck(label="example", status="passed", outputs=[output], buffers=[output]),
            SampleCheck(label="max", status="skipped", reason="r"),
        ],
        roundtrip=RoundtripCheck(status="passed", bitwise_equal=True, loader="l", reason="r"),
    )


def report_document(status: str) -> Any:
    latency = LatencyProfile(
        threads=4,
        warmup=1,
        runs=2,
        budget_reached=False,
        p50_ms=1,
        p90_ms=1,
        mean_ms=1,
        min_ms=1,
        max_ms=1,
    )
    check = GenerationCheck(max_new_tokens=2, prompt_tokens=2, matched=True)
    error = ErrorBody(
        code="data_dependent",
        message="m",
        hint="h",
        location=SourceLocation(file="model.py", line=3, code="if x:"),
        exportdb=["cond_branch"],
    )
    report = ReportDocument(
        status=status,  # type: ignore[arg-type]
        stages=[StageRecord(name="loading", status="succeeded", duration_s=0.1, message="s")],
        tracing=TracingReport(
            attempts=[
                TraceAttempt(strict=True, succeeded=False, duration_s=0.1, error=error),
                TraceAttempt(strict=False, succeeded=True, duration_s=0.1),
            ],
            dynamic_shapes=DynamicShapesReport(fixes=[DynamicShapeFix(text="t", name="n")]),
        ),
        decomposition=DecompositionReport(
            mode="core_aten", ops_after={"aten.add": 1}, non_core_aten_ops=["my.op"]
        ),
        verification=_verification(),
        warnings=[ReportWarning(code="torch_warning", message="w", details={"k": "v"})],
        error=error if status == "failed" else None,
        draft_export=[
            DraftIssue(type="t", message="m", location=SourceLocation(file="f.py", line=1))
        ],
        targets={"onnx": TargetResult(status="succeeded", verification=_verification())},
        environment=Environment(torchport="0", python="3", platform="linux"),
        artifacts=[ArtifactInfo(name="program.pt2", size=1, sha256="a" * 64)],
        sandbox=SandboxReport(layers=["zygote"]),
        generation=GenerationReport(
            max_cache_len=8,
            check=check,
            encoder=EncoderReport(
                artifact="encoder.pt2",
                inputs=["input_ids"],
                input_shape=[1, "s"],
                verification=_verification(),
                roundtrip=RoundtripCheck(status="passed"),
            ),
        ),
        profile=ProfileReport(
            machine=MachineProfile(cpu="c", architecture="a", isa=["avx2"], threads=4),
            runs=2,
            warmup=1,
            budget_s=1,
            duration_s=1,
            artifacts=[
                ArtifactProfile(
                    name="program",
                    kind="program",
                    status="failed",
                    artifact="program.pt2",
                    runtime="r",
                    error="e",
                    latency=[latency],
                ),
                ArtifactProfile(name="onnx", kind="target", runtime="r", latency=[latency]),
            ],
        ),
    ).model_dump(mode="json")
    report["quantization"] = {
        "scheme": "int8",
        "targets": {"onnx": {"measured": True, "passed": True, "cosine": 0.99, "method": "m"}},
    }
    return report


def signature_document() -> Any:
    return SignatureDocument.model_validate(
        {
            "inputs": [
                {
                    "kind": "user_input",
                    "name": "x",
                    "shape": [1, "s"],
                    "dtype": "f",
                    "pytree_path": "x",
                }
            ],
            "outputs": [{"kind": "user_output", "name": "o", "shape": [1], "dtype": "f"}],
            "range_constraints": [{"symbol": "s", "min": 1, "max": None}],
        }
    ).model_dump(mode="json")


def events_stream(final: Any) -> bytes:
    stage = StageEvent(stage="tracing", status="started", at=AT, message="m").model_dump(
        mode="json"
    )
    frames = [("stage", hostile(stage, StageEvent)), ("job", final)]
    return "".join(f"event: {kind}\ndata: {json.dumps(data)}\n\n" for kind, data in frames).encode()


def test_status_logs_list_cancel_and_errors_show_a_servers_text_as_escapes(
    evil: HostileServer,
) -> None:
    job = hostile(job_document(), JobPublic)
    evil.answer("GET", "/v1/exports/j1", dumps(job))
    evil.answer("DELETE", "/v1/exports/j1", dumps(job))
    summary = JobSummary(
        id="j1", status="failed", created_at=AT, model_name="m.py", targets=["onnx"]
    ).model_dump(mode="json")
    page = JobList(items=[JobSummary.model_validate(summary)], next_cursor="c")
    evil.answer("GET", "/v1/exports", dumps(hostile(page.model_dump(mode="json"), JobList)))
    refusal = ErrorBody(code="not_found", message="m", hint="h", details={"k": "v"})
    evil.answer(
        "GET", "/v1/exports/gone", dumps(hostile(refusal.model_dump(mode="json"), ErrorBody)), 404
    )
    # not JSON: its text is the message (UTF-8 has no lone surrogate: written as its escape)
    evil.answer("GET", "/v1/exports/broken", PAYLOAD.replace("\ud800", "\\ud800").encode(), 502)
    environment = EnvironmentList(
        workers=[
            WorkerEnvironment(
                queue="cpu",
                hostname="h",
                recorded_at=AT,
                environment=EnvironmentDescription(
                    python="3",
                    platform="linux",
                    torchport="0",
                    torch="2",
                    libraries=[
                        LibraryInfo(
                            name="a", version="1", model_library=True, imports=False, error="e"
                        ),
                        LibraryInfo(name="b", version="2"),
                    ],
                    targets=[TargetSupport(name="onnx", works=False, missing=["onnx"], error="e")],
                    described_at=AT,
                ),
            )
        ]
    )
    evil.answer(
        "GET",
        "/v1/environment",
        dumps(hostile(environment.model_dump(mode="json"), EnvironmentList)),
    )

    for command in (
        ["status", "j1"],
        ["logs", "j1"],
        ["list"],
        ["cancel", "j1"],
        ["status", "gone"],
        ["logs", "broken"],
        ["env", "--server", evil.url, "--all"],
    ):
        done = torchport(evil, *command)
        assert done.returncode in (0, 1, 2), command
        assert_shown_safely(done)
    # `logs` prints one event a line: no text of the job starts a line of its own
    assert len(torchport(evil, "logs", "j1").stdout.splitlines()) == len(job["stages"])
    # --json: the same values, every non-ASCII character escaped
    for command in (["status", "j1"], ["logs", "j1"], ["list"], ["status", "gone"]):
        done = torchport(evil, *command, "--json")
        assert "Traceback" not in done.stderr, done.stderr
        assert UNSAFE.findall(done.stdout) == []
        try:
            documents = [json.loads(done.stdout)]
        except json.JSONDecodeError:  # one document a line
            documents = [json.loads(line) for line in done.stdout.splitlines()]
        assert PAYLOAD in set(strings(documents)), command


def strings(data: Any) -> Iterator[str]:
    """Every string of JSON data, keys included."""
    if isinstance(data, str):
        yield data
    elif isinstance(data, dict):
        for key, value in data.items():
            yield key
            yield from strings(value)
    elif isinstance(data, list):
        for item in data:
            yield from strings(item)


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_submit_shows_a_servers_job_and_report_as_escapes(
    evil: HostileServer, outcome: str, tmp_path: Path
) -> None:
    keep = ("name",)  # the artifacts' names, so that the report is fetched
    names = ("report.json", "signature.json")
    queued = hostile(job_document("queued", names), JobPublic, keep)
    final = hostile(job_document(outcome, names), JobPublic, keep)
    evil.answer("POST", "/v1/exports", dumps(queued), 202)
    evil.answer("GET", "/events", events_stream(final), content_type="text/event-stream")
    evil.answer(
        "GET", "/artifacts/report.json", dumps(hostile(report_document(outcome), ReportDocument))
    )
    evil.answer(
        "GET", "/artifacts/signature.json", dumps(hostile(signature_document(), SignatureDocument))
    )
    done = torchport(evil, "submit", str(MODELS / "service_small.py"), "--wait")
    assert done.returncode == (0 if outcome == "succeeded" else 1), done.stderr
    assert_shown_safely(done)


def _zip(members: dict[str, bytes], listed: list[dict[str, Any]] | None = None) -> bytes:
    import hashlib

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(zipfile.ZipInfo(name), data)
        if listed is None:
            listed = [
                {"name": n, "size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                for n, d in members.items()
            ]
        zf.writestr("manifest.json", json.dumps({"job_id": "j1", "artifacts": listed}))
    return buffer.getvalue()


def _archive_naming(name: str) -> bytes:
    import hashlib

    data = b"{}"
    entry = {"name": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    return _zip({name.split("\x00")[0]: data}, [entry])


BAD_ARCHIVES: dict[str, Callable[[], bytes]] = {
    "empty name": lambda: _archive_naming(""),
    "absolute": lambda: _archive_naming("/tmp/torchport-evil"),
    "dot dot": lambda: _archive_naming("../escaped.json"),
    "nested dot dot": lambda: _archive_naming("a/../../escaped.json"),
    "dot": lambda: _archive_naming("."),
    "backslash": lambda: _archive_naming("..\\escaped.json"),
    "nul": lambda: _archive_naming("report.json\x00.sh"),
    "escape sequence": lambda: _archive_naming("\x1b]0;t\x07.json"),
    "hidden": lambda: _archive_naming(".bashrc"),
    "too long": lambda: _archive_naming("a" * 300),
    "listed but absent": lambda: _zip({}, [{"name": "report.json", "size": 2, "sha256": "a" * 64}]),
    "longer than listed": lambda: _zip(
        {"report.json": b"{}" * 1000}, [{"name": "report.json", "size": 2, "sha256": "a" * 64}]
    ),
    "manifest not an object": lambda: _zip({}, [["report.json"]]),  # type: ignore[list-item]
    "no manifest": lambda: _zip_without_manifest(),
    "not a zip": lambda: b"PK\x03\x04 not a zip at all",
}


def _zip_without_manifest() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        zf.writestr("report.json", b"{}")
    return buffer.getvalue()


@pytest.mark.parametrize("case", list(BAD_ARCHIVES))
def test_download_refuses_an_archive_naming_anything_but_a_plain_file(
    evil: HostileServer, case: str, tmp_path: Path
) -> None:
    evil.answer("GET", "/v1/exports/j1", dumps(job_document("succeeded")))
    evil.answer("GET", "/artifacts.zip", BAD_ARCHIVES[case](), content_type="application/zip")
    out = tmp_path / "work" / "out"
    done = torchport(evil, "download", "j1", "--out", str(out), "--json")
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2
    assert json.loads(done.stdout)["code"] == "internal_error"
    assert list(out.iterdir()) == []  # nothing written, no temporary left
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["out"]
    assert not Path("/tmp/torchport-evil").exists()
    shown = torchport(evil, "download", "j1", "--out", str(out))
    assert shown.returncode == 2
    assert "Traceback" not in shown.stderr and UNSAFE.findall(shown.stdout + shown.stderr) == []


def test_download_saves_a_good_archive(evil: HostileServer, tmp_path: Path) -> None:
    evil.answer("GET", "/v1/exports/j1", dumps(job_document("succeeded")))
    archive = _zip({"report.json": b"{}", "program.pt2": b"PK"})
    evil.answer("GET", "/artifacts.zip", archive, content_type="application/zip")
    done = torchport(evil, "download", "j1", "--out", str(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    assert sorted(f["name"] for f in json.loads(done.stdout)["files"]) == [
        "program.pt2",
        "report.json",
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["program.pt2", "report.json"]
