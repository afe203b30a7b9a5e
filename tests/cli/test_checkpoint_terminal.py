"""What the CLI tells of checkpoints and their jobs in a terminal and a log: `status` says
whether the export verified and its generation matched, `list` fits 80 columns without
cutting a value, `--task` takes optimum's names and lists the valid ones, the generation
flags reach the options, a missing directory is a usage error, and a local export prints
its stages when its output is no terminal. Against a real API process (`server` of
tests/cli/test_jobs.py) where a server is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import get_args

from persistence.lifecycle import StoredArtifact, claim, finish
from schemas import ReportDocument
from schemas.options import TaskName
from tests.cli.test_jobs import Server, server, torchport
from tests.conftest import pg_url, redis_prefix
from tests.service.conftest import MODELS, ROOT
from torchport.summary import generation_text, verdict_text

__all__ = ["pg_url", "redis_prefix", "server"]

TASKS = list(get_args(TaskName))
CLI = (sys.executable, "-m", "torchport.cli")

CHECK = {"max_new_tokens": 16, "prompt_tokens": 16, "expected": [5] * 16}
REPORT = ReportDocument.model_validate(
    {
        "status": "succeeded",
        "environment": {"torchport": "0", "python": "3.11", "platform": "linux"},
        "verification": {
            "enabled": True,
            "passed": True,
            "verdict": "verified",
            "checked": 1,
            "skipped": 0,
            "samples": [{"label": "example", "status": "passed"}],
        },
        "generation": {
            "max_cache_len": 256,
            "inputs": ["input_ids", "cache_position"],
            "check": {**CHECK, "matched": True, "generated": [5] * 16},
        },
        "targets": {
            "onnx": {
                "status": "succeeded",
                "artifact": "model.onnx",
                "generation": {
                    **CHECK,
                    "matched": False,
                    "first_mismatch": 7,
                    "generated": [5] * 7 + [6] * 9,
                },
            }
        },
    }
)
"""A generation-ready export's report: verified, its generation matched; its ONNX model's
generation did not."""


def finish_with_report(server: Server, job_id: str, report: ReportDocument) -> None:
    assert claim(server.state.sessions, job_id, "w") is not None
    path = server.tmp / f"{job_id}-report.json"
    path.write_text(report.model_dump_json())
    sha, size = server.state.store.put_file(path)
    stored = StoredArtifact(name="report.json", sha256=sha, size=size, media_type="x/json")
    done = finish(
        server.state.sessions, job_id, "w", status="succeeded", error=None, artifacts=[stored]
    )
    assert done


def test_status_says_whether_it_verified_and_its_generation_matched(server: Server) -> None:
    job_id = server.submit(server.alice, note="\n# verdicts\n")
    finish_with_report(server, job_id, REPORT)
    shown = torchport(server, "status", job_id)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert REPORT.verification is not None and REPORT.generation is not None
    assert REPORT.generation.check is not None
    assert verdict_text(REPORT.verification) in text
    assert generation_text(REPORT.generation.check) in text
    onnx = REPORT.targets["onnx"].generation
    assert onnx is not None and generation_text(onnx) in text
    # --json stays the job itself
    assert json.loads(torchport(server, "status", job_id, "--json").stdout)["id"] == job_id


def test_list_at_80_columns_cuts_no_value(server: Server) -> None:
    job_id = server.submit(server.alice, note="\n# list\n")
    page = json.loads(torchport(server, "list", "--json").stdout)["items"]
    env_width = {**os.environ, "COLUMNS": "80", "TORCHPORT_SERVER": server.url}
    env_width["TORCHPORT_API_KEY"] = server.alice
    shown = subprocess.run(
        [*CLI, "list"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=env_width,
    )
    assert shown.returncode == 0, shown.stderr
    assert "…" not in shown.stdout
    assert max(len(line) for line in shown.stdout.splitlines()) <= 80
    assert job_id in shown.stdout
    for item in page:
        assert item["id"] in shown.stdout and item["model_name"] in shown.stdout
        if item["error"]:
            assert item["error"]["code"] in shown.stdout


def test_task_takes_optimums_names_and_the_generation_flags(server: Server) -> None:
    sent = torchport(
        server,
        "submit",
        str(MODELS / "service_small.py"),
        "--task",
        "text-generation-with-past",
        "--max-cache-len",
        "64",
        "--max-new-tokens",
        "4",
        "--json",
    )
    assert sent.returncode == 0, sent.stderr
    options = json.loads(sent.stdout)["options"]
    assert options["task"] == "text-generation"
    assert (options["generation"]["max_cache_len"], options["generation"]["max_new_tokens"]) == (
        64,
        4,
    )
    for name, task in (("seq2seq-lm", "text2text-generation"), ("masked-lm", "fill-mask")):
        again = torchport(server, "submit", str(MODELS / "service_small.py"), "--task", name)
        assert again.returncode == 0, again.stderr
        job_id = again.stdout.split()[0]
        job = json.loads(torchport(server, "status", job_id, "--json").stdout)
        assert job["options"]["task"] == task


def test_an_unknown_task_lists_the_valid_ones(server: Server, tmp_path: Path) -> None:
    model = str(MODELS / "service_small.py")
    for command in (["submit", model], ["export", model, "--out", str(tmp_path)]):
        refused = torchport(server, *command, "--task", "text-gen", "--json")
        assert refused.returncode == 2, refused.stderr
        body = json.loads(refused.stdout)
        assert body["code"] == "invalid_request"
        assert body["details"]["task"] == "text-gen"
        assert body["details"]["valid"] == TASKS
        # in the terminal: the code, and every valid task in the hint
        said = torchport(server, *command, "--task", "text-gen")
        assert said.returncode == 2
        text = " ".join(said.stderr.split())
        assert "invalid_request" in text and all(task in text for task in TASKS)
        assert "Traceback" not in said.stderr


def test_submitting_a_directory_that_is_not_there_is_a_usage_error(
    server: Server, tmp_path: Path
) -> None:
    missing = tmp_path / "nope-dir"
    said = torchport(server, "submit", str(missing), "--json")
    assert said.returncode == 2
    body = json.loads(said.stdout)
    assert body["code"] == "invalid_request"
    assert body["details"] == {"argument": "MODEL", "path": str(missing)}
    shown = torchport(server, "submit", str(missing))
    assert shown.returncode == 2 and "Traceback" not in shown.stderr
    assert "invalid_request" in shown.stderr and len(shown.stderr.splitlines()) <= 3


def test_a_local_export_prints_its_stages_when_its_output_is_no_terminal(
    tmp_path: Path,
) -> None:
    done = subprocess.run(
        [*CLI, "export", str(MODELS / "service_small.py"), "--out", str(tmp_path / "out")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    stages = [stage["name"] for stage in report["stages"]]
    # a line per stage, as it starts: "<seconds> s  <stage>: <message>"
    printed = [
        line.split(" s  ", 1)[1].split(":", 1)[0]
        for line in done.stderr.splitlines()
        if " s  " in line
    ]
    assert list(dict.fromkeys(stage for stage in printed if stage in stages)) == stages
