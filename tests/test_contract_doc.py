"""docs/contract.md agrees with the code: routes, error codes, options, warnings, CLI.

The contract is the page users rely on; these tests fail when a route, a code, an option
or a command is added, removed or renamed in the code without the page following (or the
page names something the code does not have). And nothing in the repository may point at
a contract outside it.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from schemas import ERROR_CODES, SubmittedOptions, outcomes
from service.app import create_app
from service.errors import ERROR_CLASSES
from service.settings import ServiceSettings
from torchport.cli import MODULES, SUBCOMMANDS

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = ROOT / "docs" / "contract.md"
TEXT = CONTRACT.read_text(encoding="utf-8")
HTTP_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
_ROUTE = re.compile(rf"`({'|'.join(HTTP_METHODS)}) (/[^`\s]*)`")
_FIRST_CELL = re.compile(r"^\| `([^`]+)` \|", re.M)


def section(number: int) -> str:
    """The text of `## <number>. …` up to the next `## ` heading."""
    match = re.search(rf"^## {number}\. .*?(?=^## |\Z)", TEXT, re.M | re.S)
    assert match, f"docs/contract.md has no section {number}"
    return match.group(0)


def rows(text: str) -> dict[str, list[str]]:
    """Table rows keyed by their first cell's code span: the cells after it."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = _FIRST_CELL.match(line)
        if match:
            assert match.group(1) not in found, f"{match.group(1)} is in the table twice"
            found[match.group(1)] = [cell.strip() for cell in line.strip("|").split(" | ")[1:]]
    return found


def _template(path: str) -> str:
    """A route with its parameters unnamed: `/v1/exports/{}` for `{id}` and `{job_id}`."""
    return re.sub(r"\{[^}]*\}", "{}", path)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # No database or broker is touched: the app's state is built only when it starts.
    return create_app(ServiceSettings(data_dir=tmp_path_factory.mktemp("data")))


# ---------------------------------------------------------------------------- REST API


def test_every_openapi_route_is_in_the_contract(app: Any) -> None:
    documented = {(m, _template(p)) for m, p in _ROUTE.findall(section(7))}
    paths = app.openapi()["paths"]
    assert paths, "the OpenAPI document has no paths"
    missing = [
        f"{method.upper()} {path}"
        for path, operations in paths.items()
        for method in operations
        if (method.upper(), _template(path)) not in documented
    ]
    assert missing == []


def test_every_route_in_the_contract_exists(app: Any) -> None:
    existing = {
        (method.upper(), _template(path))
        for path, operations in app.openapi()["paths"].items()
        for method in operations
    }
    # Routes left out of the schema: the OpenAPI document and docs, the browser pages.
    for route in app.routes:
        path, methods = getattr(route, "path", None), getattr(route, "methods", None)
        if path and methods:
            existing |= {(method, _template(path)) for method in methods}
    documented = _ROUTE.findall(section(7))
    assert len(documented) >= 12
    assert [f"{m} {p}" for m, p in documented if (m, _template(p)) not in existing] == []


# -------------------------------------------------------------------------- error codes


def test_the_error_table_lists_every_code_once_and_nothing_else() -> None:
    table = rows(section(5))
    assert set(table) == set(ERROR_CODES)


def test_the_error_table_gives_the_status_the_api_answers_with() -> None:
    table = rows(section(5))
    api_codes = {cls.code: cls.status_code for cls in ERROR_CLASSES}
    assert set(api_codes) <= set(ERROR_CODES)
    for code in ERROR_CODES:
        expected = str(api_codes[code]) if code in api_codes else "*job*"
        assert table[code][0] == expected, code


def test_the_catalogue_gives_the_status_of_the_error_table() -> None:
    table = rows(section(5))
    for code in ERROR_CODES:
        entry = outcomes.outcome(code)
        assert table[code][0] == (str(entry.http_status) if entry.http_status else "*job*"), code
        if table[code][0] == "*job*" or "as a *job* error" in table[code][2]:
            assert entry.ends_jobs, code


# ------------------------------------------------------------------------------ options


def _option_fields() -> dict[str, Any]:
    """Every field of the `options` a user sends, nested ones dotted, with its default."""
    fields: dict[str, Any] = {}
    for name, info in SubmittedOptions.model_fields.items():
        default = info.get_default(call_default_factory=True)
        fields[name] = default
        if isinstance(default, BaseModel):
            for sub, sub_info in type(default).model_fields.items():
                fields[f"{name}.{sub}"] = sub_info.get_default(call_default_factory=True)
    return fields


def test_the_options_table_lists_every_field_and_nothing_else() -> None:
    assert set(rows(section(2))) == set(_option_fields())


def test_the_options_table_gives_each_default() -> None:
    table = rows(section(2))
    for name, default in _option_fields().items():
        cell = table[name][1]
        if isinstance(default, BaseModel):
            assert cell == "see below", name
        else:
            assert cell == f"`{json.dumps(default)}`", name


def test_the_options_example_is_the_defaults() -> None:
    block = re.search(r"```json\n(.*?)```", section(2), re.S)
    assert block
    assert json.loads(block.group(1)) == SubmittedOptions().model_dump(mode="json")


# ----------------------------------------------------------------------------- warnings


def test_the_warning_table_lists_every_code_the_code_writes() -> None:
    written = set()
    for package in ("engine", "worker"):
        for path in (ROOT / package).rglob("*.py"):
            written |= set(re.findall(r'ReportWarning\(\s*code="(\w+)"', path.read_text()))
    assert len(written) >= 7
    assert set(rows(section(6))) == written


# ---------------------------------------------------------------------------------- CLI


def _options_of(parser: argparse.ArgumentParser) -> set[str]:
    """Long options and sub-command names, nested sub-commands included."""
    names = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                names |= {name, *_options_of(sub)}
        names |= {opt for opt in action.option_strings if opt.startswith("--")}
    return names - {"--help"}


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_every_command_and_option_is_in_the_cli_table(command: str) -> None:
    cli = rows(section(8))
    row = next((key for key in cli if key.startswith(f"torchport {command} ")), None)
    assert row is not None, f"torchport {command} is not in the CLI table"
    line = next(line for line in section(8).splitlines() if line.startswith(f"| `{row}`"))
    parser = argparse.ArgumentParser()
    importlib.import_module(f"torchport.commands.{MODULES.get(command, command)}").add_arguments(
        parser
    )
    options = _options_of(parser)
    assert options
    assert sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}\b", line)) == []


def test_the_cli_table_has_no_command_the_cli_lacks() -> None:
    named = {key.split()[1] for key in rows(section(8)) if key.startswith("torchport ")}
    assert named == set(SUBCOMMANDS)


# ------------------------------------------------------------------- nothing outside


FORBIDDEN = re.compile(r"\.\./shared|shared/CONTRACT|CONTRACT\.md")


def test_no_tracked_file_points_at_a_contract_outside_the_repository() -> None:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.md", "*.py", "*.html", "*.js"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    files = [ROOT / name for name in listed.split("\0") if name]
    assert CONTRACT in files or CONTRACT.exists()
    assert len(files) > 50
    offenders = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}"
        for path in files
        if path != Path(__file__).resolve() and path.is_file()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert offenders == []


def test_the_readme_links_the_contract() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "(docs/contract.md)" in readme


def test_the_readme_sets_up_with_two_commands_and_says_where_the_cpu_torch_is() -> None:
    readme = (ROOT / "README.md").read_text()
    setup = readme.split("## Set up", 1)[1].split("\n## ", 1)[0]
    assert setup.count("```bash") == 2  # one installs and runs the service, one the tests
    assert "--index-url https://download.pytorch.org/whl/cpu" in setup
    assert "DEVICE=cuda" in setup  # what the GPU worker image uses
