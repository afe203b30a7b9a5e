"""A job's own text — its progress messages, its exception's message, hint and source line —
reaches the terminal through `torchport logs` and `torchport status` with its escape
sequences shown, never run (issue 33, item 9), against a real API process: the job
writes through the worker's own calls (`record_stage`, `finish`)."""

from __future__ import annotations

import json

from persistence.lifecycle import claim, finish, record_stage
from schemas import ErrorBody, SourceLocation
from tests.cli.test_hostile_server import MARKUP, UNSAFE
from tests.cli.test_jobs import Server, pg_url, redis_prefix, server, torchport

__all__ = ["pg_url", "redis_prefix", "server"]

JOB_TEXT = (
    "\x1b]0;TITLE\x07"  # window title
    "\x1b]52;c;Y3VybCBldmls\x07"  # OSC 52: write the clipboard
    "\x1b[2J"  # clear the screen
    "\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # a hyperlink
    "\x9b31m\x7f\r\n\u202eevil\u2066" + MARKUP  # C1 CSI, DEL, CR, newline, bidi override, isolate
)
"""What a job may write (the database holds no NUL and no lone surrogate)."""


def test_a_jobs_messages_and_error_reach_the_terminal_as_escapes(server: Server) -> None:
    job_id = server.submit(server.alice, note="\n# escapes\n")
    assert claim(server.state.sessions, job_id, "w") is not None
    for fraction in (0.25, 0.5):
        record_stage(
            server.state.sessions,
            job_id,
            "w",
            stage="loading",
            status="progress",
            fraction=fraction,
            message=JOB_TEXT,
        )
    error = ErrorBody(
        code="data_dependent",
        message=JOB_TEXT,
        hint=JOB_TEXT,
        location=SourceLocation(file="model.py", line=7, code=JOB_TEXT),
    )
    assert finish(server.state.sessions, job_id, "w", status="failed", error=error, artifacts=[])

    recorded = json.loads(torchport(server, "status", job_id, "--json").stdout)
    for command in (["logs", job_id], ["status", job_id]):
        shown = torchport(server, *command)
        assert shown.returncode == 1, shown.stderr
        assert UNSAFE.findall(shown.stdout + shown.stderr) == []
        for escaped in ("\\x1b]52;c;", "\\x9b", "\\u202e", MARKUP):
            assert escaped in shown.stdout
    lines = torchport(server, "logs", job_id).stdout.splitlines()
    assert len(lines) == len(recorded["stages"])  # a newline in a message starts no line

    as_json = torchport(server, "logs", job_id, "--json")
    assert UNSAFE.findall(as_json.stdout) == []
    messages = [json.loads(line)["message"] for line in as_json.stdout.splitlines()]
    assert messages.count(JOB_TEXT) == 2  # the same values, escaped as JSON
