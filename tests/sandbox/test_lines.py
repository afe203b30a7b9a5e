"""A line a job writes never crashes a shared process (issue: one line from a job killed
the zygote, or the worker's reader thread): every line from a job is parsed with size
and depth bounds (protocol.loads_untrusted), and a malformed one is that job's
`sandbox_violation` at worst."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest

from tests.sandbox.conftest import MODELS, Arena
from worker.sandbox import protocol


def _model(arena: Arena, mode: str) -> Path:
    text = (MODELS / "hostile_lines.py").read_text()
    text = text.replace('MODE = "deep_request"', f"MODE = {mode!r}")
    path = arena.root / f"lines_{mode}.py"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 6000 + b"]" * 6000,
        b'{"threads": Infinity}',
        b'{"a": NaN}',
        b"\xff\xfe",
        b"[1, 2]",
        b'{"a": "' + b"x" * 100 + b'"}',
    ],
    ids=["deep", "infinity", "nan", "not-utf8", "not-object", "too-long"],
)
def test_untrusted_lines_raise_one_error_type(data: bytes) -> None:
    with pytest.raises(protocol.UntrustedLine):
        protocol.loads_untrusted(data, max_bytes=64)  # the deep one is over 64 bytes too
    if data.startswith(b"["):
        with pytest.raises(protocol.UntrustedLine):
            protocol.loads_untrusted(data, max_bytes=1 << 20)


def test_strings_with_brackets_are_not_depth() -> None:
    line = b'{"message": "' + b"[{" * 500 + b'"}'
    assert protocol.loads_untrusted(line, 1 << 20) == {"message": "[{" * 500}


@pytest.mark.parametrize("mode", ["deep_request", "infinite_threads"])
def test_a_hostile_roundtrip_request_does_not_kill_the_zygote(arena: Arena, mode: str) -> None:
    restarts = arena.runner.restarts
    result, _, _ = arena.run(_model(arena, mode))
    # The zygote answered the line with a refusal, which the job's own round trip then
    # read first: the job's problem alone.
    assert result.error is not None
    assert result.error.code == "serialization_failed"
    assert result.error.details["reason"] == "malformed round-trip request"
    assert arena.runner.restarts == restarts
    assert arena.runner.zygote_pid == arena.zygote_pid
    assert os.path.exists(f"/proc/{arena.zygote_pid}")
    benign, _, _ = arena.run(arena.model("benign"))
    assert benign.report.status == "succeeded"
    assert arena.runner.restarts == restarts


def _pipes() -> set[str]:
    """The pipes this process holds open (`pipe:[inode]`). Other fixtures of the full
    suite open sockets and files in threads of their own; only pipes are the runner's."""
    held = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed since the listing (the listing's own fd, too)
        if target.startswith("pipe:"):
            held.add(target)
    return held


def _new_pipes(before: set[str], wait_s: float = 10.0) -> set[str]:
    """Pipes opened since `before` that are still open after up to `wait_s`: a leak
    stays open for good, a reader thread still finishing closes its ends meanwhile."""
    deadline = time.monotonic() + wait_s
    while (new := _pipes() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    return new


def test_a_hostile_progress_line_is_the_jobs_violation(arena: Arena) -> None:
    arena.run(arena.model("benign"))  # the reader threads' own fds exist from now on
    before = _pipes()
    result, elapsed, _ = arena.run(_model(arena, "deep_progress"), options={"timeout_s": 60})
    assert result.error is not None
    assert result.error.code == "sandbox_violation"
    assert result.error.details["bad_lines"] >= 1
    assert elapsed < 30  # the 1 MiB after the line was read, not left to block the job
    assert _new_pipes(before) == set()
    benign, _, _ = arena.run(arena.model("benign"))
    assert benign.report.status == "succeeded"


def test_large_valid_options_reach_the_job(arena: Arena) -> None:
    preserve = ["aten.linear.default"] * 3500  # ~80 KiB of options: over a control message
    result, _, _ = arena.run(
        arena.model("benign"), options={"decomposition": {"preserve": preserve}}
    )
    assert result.error is None, result.error
    assert result.report.status == "succeeded"


def test_a_dropped_loader_is_stopped_and_the_round_trip_goes_on(arena: Arena) -> None:
    """`{"drop": true}` (a job whose program changed after it announced it) is answered
    `{"dropped": true}` with or without a loader, after any answer given before it; a
    loader still loading is stopped unheard, and the job's next round trip gets a loader
    of its own (the model checks the answers at import, the pipeline's round trip
    follows)."""
    restarts = arena.runner.restarts
    result, _, _ = arena.run(MODELS / "roundtrip_drop.py")
    report = result.report
    assert report.status == "succeeded", report.error
    assert report.verification is not None and report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    assert report.sandbox is not None
    # the two dropped (the refused request started none), then the pipeline's own
    assert report.sandbox.details["roundtrips"]["loaders"] == 3
    assert arena.runner.restarts == restarts


def test_a_job_that_does_not_read_its_answers_is_killed_not_waited_for(arena: Arena) -> None:
    """8,000 requests whose answers the job never reads would fill its answer pipe and
    block the zygote, which serves every job: the zygote kills the job instead."""
    restarts = arena.runner.restarts
    result, elapsed, _ = arena.run(_model(arena, "answer_flood"), options={"timeout_s": 90})
    assert result.report.status == "failed"
    assert result.error is not None
    assert result.error.code == "sandbox_violation"
    assert result.error.details["reason"].startswith("round-trip answers left unread")
    assert elapsed < 60  # killed when the pipe filled, not at its 90 s timeout
    assert arena.runner.restarts == restarts
    assert arena.runner.zygote_pid == arena.zygote_pid
    benign, _, _ = arena.run(arena.model("benign"))
    assert benign.report.status == "succeeded"


def test_a_loaders_answer_is_passed_on_while_read_and_given_up_when_not() -> None:
    """A loader's answer may be larger than a pipe holds: the zygote writes it as the job
    reads, and gives up on a job that leaves it unread (it would block every job)."""
    import threading

    from worker.sandbox.zygote.relay import Relay, UnreadAnswer

    line = b'{"outputs": "' + b"x" * (200 << 10) + b'"}\n'
    for reading in (True, False):
        loader_r, loader_w = os.pipe()
        job_r, job_w = os.pipe()
        got = bytearray()

        reader = threading.Thread(target=_read_all, args=(job_r, got), daemon=True)
        try:
            relay = Relay(len(line) + 16)
            writer = threading.Thread(target=os.write, args=(loader_w, line), daemon=True)
            writer.start()
            while relay.line_length() == 0:
                relay.read_from(loader_r)
            if reading:
                reader.start()
                assert relay.pass_on(job_w, wait_s=10)
                os.close(job_w)
                reader.join(timeout=10)
                assert bytes(got) == line
            else:
                started = time.monotonic()
                with pytest.raises(UnreadAnswer):
                    relay.pass_on(job_w, wait_s=0.5)
                assert time.monotonic() - started < 5
        finally:
            for fd in (loader_r, loader_w, job_r, job_w):
                with contextlib.suppress(OSError):
                    os.close(fd)


def _read_all(fd: int, into: bytearray) -> None:
    while chunk := os.read(fd, 1 << 16):
        into.extend(chunk)
