"""`torchport status`, `list`, `cancel` and `download` against a real API process (uvicorn on
PostgreSQL and Redis), with API keys; jobs are finished here as a worker finishes them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from persistence.database import transaction
from persistence.lifecycle import StoredArtifact, claim, finish, record_stage
from schemas import ErrorBody, SourceLocation, StageEvent
from service import auth
from service.app import build_state
from service.deps import AppState
from tests.conftest import REDIS_URL, pg_url, redis_prefix
from tests.integration.conftest import Stack, stack_env
from tests.service.conftest import MODELS, ROOT, make_settings, truncate

__all__ = ["pg_url", "redis_prefix"]

ARTIFACTS = {
    "program.pt2": b"PK\x03\x04" + bytes(range(256)) * 64,
    "graph.json": b'{"nodes": []}',
    "report.json": b'{"status": "succeeded"}',
}


@dataclass
class Server:
    """The API process, this process's view of its database and store, and two keys."""

    url: str
    state: AppState
    alice: str
    bob: str
    tmp: Path

    def submit(self, key: str, model: str = "service_small.py", note: str = "") -> str:
        source = (MODELS / model).read_bytes() + note.encode()
        answer = httpx.post(
            f"{self.url}/v1/exports",
            files={"model": ("model.py", source)},
            headers={"Authorization": f"Bearer {key}"},
        )
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    def finish(self, job_id: str, error: ErrorBody | None = None) -> None:
        assert claim(self.state.sessions, job_id, "w") is not None
        stored = []
        for name, data in ARTIFACTS.items():
            if error is not None and name != "report.json":
                continue
            path = self.tmp / f"{job_id}-{name}"
            path.write_bytes(data)
            sha, size = self.state.store.put_file(path)
            media = "application/json" if name.endswith(".json") else "application/zip"
            stored.append(StoredArtifact(name=name, sha256=sha, size=size, media_type=media))
        status = "failed" if error else "succeeded"
        assert finish(
            self.state.sessions, job_id, "w", status=status, error=error, artifacts=stored
        )


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, pg_url: str, redis_prefix: str
) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("cli-jobs")
    state = build_state(make_settings(tmp, pg_url, redis_prefix + "cli:"))
    truncate(state.engine)
    with transaction(state.sessions) as session:
        alice = auth.create_key(session, "alice").secret
        bob = auth.create_key(session, "bob").secret
    env = stack_env(tmp, pg_url, REDIS_URL, redis_prefix + "cli:")
    env["TORCHPORT_REAPER_INTERVAL_S"] = "3600"  # a claimed job here has no heartbeat
    stack = Stack(tmp, env)
    stack.start_api()
    try:
        yield Server(url=stack.url, state=state, alice=alice, bob=bob, tmp=tmp)
    finally:
        stack.stop()
        truncate(state.engine)
        state.engine.dispose()


def torchport(
    server: Server, *args: str, key: str | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI as a pipeline runs it: server and key from the environment."""
    env = {**os.environ, "TORCHPORT_SERVER": server.url, "TORCHPORT_API_KEY": key or server.alice}
    return subprocess.run(
        [sys.executable, "-m", "torchport.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_status_list_and_download_of_finished_jobs(server: Server, tmp_path: Path) -> None:
    done = server.submit(server.alice, note="\n# done\n")
    server.finish(done)
    location = SourceLocation(file="model.py", line=7, code="if x.sum() > 0:")
    failed = server.submit(server.alice, note="\n# failed\n")
    server.finish(
        failed, ErrorBody(code="data_dependent", message="m", hint="h", location=location)
    )

    status = torchport(server, "status", done, "--json")
    assert status.returncode == 0, status.stderr
    job = json.loads(status.stdout)
    assert (job["id"], job["status"]) == (done, "succeeded")
    assert sorted(a["name"] for a in job["artifacts"]) == sorted(ARTIFACTS)

    shown = torchport(server, "status", done)
    assert shown.returncode == 0
    assert done in shown.stdout
    assert all(name in shown.stdout for name in ARTIFACTS)

    failure = torchport(server, "status", failed)
    assert failure.returncode == 1
    assert "data_dependent" in failure.stdout
    assert "model.py:7" in failure.stdout

    first = torchport(server, "list", "--limit", "1", "--json")
    assert first.returncode == 0, first.stderr
    page = json.loads(first.stdout)
    assert [item["id"] for item in page["items"]] == [failed]
    second = json.loads(torchport(server, "list", "--cursor", page["next_cursor"], "--json").stdout)
    assert [item["id"] for item in second["items"]] == [done]
    only_failed = json.loads(torchport(server, "list", "--status", "failed", "--json").stdout)
    assert [(i["id"], i["error"]["code"]) for i in only_failed["items"]] == [
        (failed, "data_dependent")
    ]
    table = torchport(server, "list")
    assert table.returncode == 0 and done in table.stdout and failed in table.stdout

    out = tmp_path / "all"
    saved = torchport(server, "download", done, "--out", str(out), "--json")
    assert saved.returncode == 0, saved.stderr
    files = json.loads(saved.stdout)["files"]
    assert sorted(p.name for p in out.iterdir()) == sorted(ARTIFACTS)  # no temporary left
    digests = {a["name"]: a["sha256"] for a in job["artifacts"]}
    for item in files:
        data = Path(item["path"]).read_bytes()
        assert data == ARTIFACTS[item["name"]]
        assert hashlib.sha256(data).hexdigest() == item["sha256"] == digests[item["name"]]

    one = tmp_path / "one"
    only = torchport(server, "download", done, "--out", str(one), "--only", "program.pt2")
    assert only.returncode == 0, only.stderr
    assert [p.name for p in one.iterdir()] == ["program.pt2"]

    report_only = tmp_path / "failed"
    of_failed = torchport(server, "download", failed, "--out", str(report_only))
    assert of_failed.returncode == 1
    assert [p.name for p in report_only.iterdir()] == ["report.json"]


def test_cancel_a_queued_and_a_running_job(server: Server) -> None:
    queued = server.submit(server.alice, note="\n# queued\n")
    canceled = torchport(server, "cancel", queued, "--json")
    assert canceled.returncode == 0, canceled.stderr
    assert json.loads(canceled.stdout)["status"] == "canceled"
    again = torchport(server, "cancel", queued, "--json")
    assert again.returncode == 2
    body = json.loads(again.stdout)
    assert (body["code"], body["details"]["status"]) == ("conflict", "canceled")
    assert torchport(server, "status", queued, "--json").returncode == 1

    running = server.submit(server.alice, note="\n# running\n")
    assert claim(server.state.sessions, running, "w") is not None
    asked = torchport(server, "cancel", running)
    assert asked.returncode == 0
    assert running in asked.stdout
    job = json.loads(torchport(server, "status", running, "--json").stdout)
    assert job["status"] == "running"


def test_refusals_exit_2_with_the_error_body(server: Server, tmp_path: Path) -> None:
    job_id = server.submit(server.alice, note="\n# alice\n")
    for command in (
        ["status", job_id],
        ["cancel", job_id],
        ["download", job_id, "--out", str(tmp_path)],
    ):
        other = torchport(server, *command, "--json", key=server.bob)
        assert other.returncode == 2, command
        assert json.loads(other.stdout)["code"] == "not_found"
    unfinished = torchport(server, "download", job_id, "--out", str(tmp_path), "--json")
    assert unfinished.returncode == 2
    assert json.loads(unfinished.stdout)["code"] == "conflict"
    assert list(tmp_path.iterdir()) == []
    server.finish(job_id)
    missing = torchport(server, "download", job_id, "--only", "model.onnx", "--json")
    assert json.loads(missing.stdout)["details"]["available"] == sorted(ARTIFACTS)

    bad_limit = torchport(server, "list", "--limit", "0", "--json")
    assert bad_limit.returncode == 2
    assert json.loads(bad_limit.stdout)["code"] == "invalid_request"
    no_key = torchport(server, "list", "--json", key="tp_not-a-key")
    assert no_key.returncode == 2
    assert json.loads(no_key.stdout)["code"] == "unauthorized"
    flag = torchport(server, "status", job_id, "--api-key", server.alice, "--json", key="tp_no")
    assert flag.returncode == 0  # --api-key wins over TORCHPORT_API_KEY
    unreachable = torchport(server, "status", job_id, "--server", "http://127.0.0.1:9", "--json")
    assert unreachable.returncode == 2
    assert json.loads(unreachable.stdout)["code"] == "unavailable"
    usage = torchport(server, "list", "--status", "nope")
    assert usage.returncode == 2


def _events(output: str) -> list[StageEvent]:
    return [StageEvent.model_validate_json(line) for line in output.splitlines()]


def test_logs_prints_a_jobs_stage_events(server: Server) -> None:
    job_id = server.submit(server.alice, note="\n# logs\n")
    server.finish(job_id)
    job = json.loads(torchport(server, "status", job_id, "--json").stdout)
    as_json = torchport(server, "logs", job_id, "--json")
    assert as_json.returncode == 0, as_json.stderr
    printed = _events(as_json.stdout)
    assert [e.model_dump(mode="json") for e in printed] == job["stages"]
    assert [(e.stage, e.status) for e in printed][-1] == (None, "succeeded")
    shown = torchport(server, "logs", job_id)
    assert shown.returncode == 0
    assert len(shown.stdout.splitlines()) == len(job["stages"])
    missing = torchport(server, "logs", "no-such-job", "--json")
    assert missing.returncode == 2
    assert json.loads(missing.stdout)["code"] == "not_found"
    other = torchport(server, "logs", job_id, "--json", key=server.bob)
    assert other.returncode == 2


@pytest.mark.parametrize("outcome", ["succeeded", "failed"])
def test_logs_follow_prints_events_as_they_come_until_the_job_ends(
    server: Server, outcome: str
) -> None:
    job_id = server.submit(server.alice, note=f"\n# follow {outcome}\n")
    assert claim(server.state.sessions, job_id, "w") is not None
    record_stage(server.state.sessions, job_id, "w", stage="loading", status="started")
    env = {**os.environ, "TORCHPORT_SERVER": server.url, "TORCHPORT_API_KEY": server.alice}
    follower = subprocess.Popen(
        [sys.executable, "-m", "torchport.cli", "logs", job_id, "--follow", "--json"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert follower.stdout is not None
        recorded = [StageEvent.model_validate_json(follower.stdout.readline()) for _ in range(3)]
        assert [(e.stage, e.status) for e in recorded] == [
            (None, "queued"),
            (None, "running"),
            ("loading", "started"),
        ]
        # while it follows: progress, a stage change, then the end
        record_stage(
            server.state.sessions, job_id, "w", stage="loading", status="progress", fraction=0.5
        )
        record_stage(server.state.sessions, job_id, "w", stage="tracing", status="started")
        error = ErrorBody(code="data_dependent", message="m") if outcome == "failed" else None
        assert finish(server.state.sessions, job_id, "w", status=outcome, error=error, artifacts=[])
        rest, errors = follower.communicate(timeout=60)
    finally:
        if follower.poll() is None:
            follower.kill()
    assert follower.returncode == (0 if outcome == "succeeded" else 1), errors
    later = _events(rest)
    assert [(e.stage, e.status, e.fraction) for e in later] == [
        ("loading", "progress", 0.5),
        ("tracing", "started", None),
        (None, outcome, None),
    ]
