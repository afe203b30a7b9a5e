"""Text UTF-8 cannot encode (a lone surrogate, `"\\udc80"`) in a job's own error, output
or progress lines: the job still ends with the error it would have without it, the
surrogate replaced by U+FFFD wherever it is written (issue: it ended as `internal_error`,
"no report.json", because the report could not be encoded)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from schemas import ExportOptions, Progress
from tests.sandbox.conftest import MODELS, Arena
from worker.sandbox import SandboxJob, SandboxResult, protocol

SURROGATE = "\udc80"
REPLACED = "\ufffd"


def _run(arena: Arena, mode: str, bad: str) -> tuple[SandboxResult, list[Progress]]:
    text = (MODELS / "hostile_surrogate.py").read_text()
    text = text.replace('MODE = "import"', f"MODE = {mode!r}")
    text = text.replace('BAD = "\\udc80"', f"BAD = {bad!r}")
    model = arena.root / f"surrogate_{mode}_{'plain' if bad == 'x' else 'bad'}.py"
    model.write_text(text)
    events: list[Progress] = []
    result = arena.runner.run(
        SandboxJob(
            model=model,
            inputs=None,
            weights=None,
            options=ExportOptions(),
            job_dir=Path(tempfile.mkdtemp(dir=arena.root)),
        ),
        on_progress=events.append,
    )
    return result, events


@pytest.mark.parametrize("mode", ["import", "forward", "lines"])
def test_a_lone_surrogate_leaves_the_users_error_as_it_is(arena: Arena, mode: str) -> None:
    plain, _ = _run(arena, mode, "x")
    result, events = _run(arena, mode, SURROGATE)
    assert plain.error is not None and result.error is not None
    assert plain.error.code != "internal_error"
    assert (result.error.code, result.error.stage) == (plain.error.code, plain.error.stage)
    assert "bad x value" in plain.error.message
    assert f"bad {REPLACED} value" in result.error.message
    # The report on disk is the one returned: UTF-8, the surrogate replaced.
    on_disk = (result.artifacts["report.json"]).read_text(encoding="utf-8")
    assert f"bad {REPLACED} value" in on_disk
    if mode == "forward":  # printed: the tail the user gets back
        assert f"printed {REPLACED} text" in result.stdout_tail  # stdout: surrogateescape
        assert "stderr \\udc80 text" in result.stdout_tail  # stderr: backslashreplace
        assert result.stdout_tail.encode("utf-8")
    if mode == "lines":  # a progress line the job wrote itself, escape and all
        assert f"bad {REPLACED} value" in [event.message for event in events]


def test_untrusted_lines_replace_lone_surrogates_and_keep_pairs() -> None:
    line = b'{"a": "\\udc80", "\\ud800": ["\\ud83d\\ude00"]}'
    assert protocol.loads_untrusted(line, 1 << 10) == {"a": REPLACED, REPLACED: ["\U0001f600"]}
