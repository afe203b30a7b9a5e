"""Lint, format, types and generated JSON Schemas are part of the test suite."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_is_clean() -> None:
    result = _run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean() -> None:
    result = _run(sys.executable, "-m", "mypy")
    assert result.returncode == 0, result.stdout + result.stderr


def test_json_schemas_are_up_to_date() -> None:
    result = _run(sys.executable, "-m", "schemas.generate", "--check")
    assert result.returncode == 0, result.stdout


def test_error_codes_match_the_contract_docs() -> None:
    from schemas import ERROR_CODES

    text = (ROOT / "docs" / "errors.md").read_text()
    documented = {line.split("`")[1] for line in text.splitlines() if line.startswith("| `")}
    assert documented == set(ERROR_CODES)
