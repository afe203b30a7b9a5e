"""Test-run wide settings: which tests may run beside others.

`scripts/test.sh` runs the suite on two pytest-xdist workers with `--dist loadgroup`.
Every test outside `tests/engine` and the pure top-level checks starts sandboxes,
servers, workers or a browser: they share the machine's sandbox slots, the job uid
range and the test database, so they all go to one group and run one after another in
one worker, as they would without xdist. The engine's tests (no sandbox, no services)
are spread over both workers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parent
PARALLEL_FILES = frozenset(
    {
        "test_layering.py",
        "test_quality.py",
        "test_contract_doc.py",
        "test_schemas_requires.py",
        "test_cli_summary.py",
    }
)
"""Top-level test files that start nothing: they may run beside anything."""
SERIAL = "machine"
"""The xdist group of every test that uses the machine's shared resources."""


def _parallel(path: Path) -> bool:
    relative = path.relative_to(TESTS)
    if relative.parts[0] == "engine":
        return True
    return len(relative.parts) == 1 and relative.name in PARALLEL_FILES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if not _parallel(Path(str(item.path))):
            item.add_marker(pytest.mark.xdist_group(SERIAL))
