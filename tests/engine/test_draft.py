"""draft_issues(): torch.export.draft_export's report as the contract's DraftIssues."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

from engine.load.model import LoadedModel
from engine.trace.draft import draft_issues
from tests.engine.test_diagnostics import SOURCE_MAP, load_fixture


def loaded(name: str, args: tuple[Any, ...] | None = None) -> LoadedModel:
    fixture = load_fixture(name)
    return LoadedModel(
        module=fixture.model,
        args=fixture.example_args if args is None else args,
        kwargs={},
        source_map=SOURCE_MAP,
        entry=f"{name}.py",
        module_name=name,
    )


def test_data_dependent_guard_with_user_location() -> None:
    issues = draft_issues(loaded("diag_item_branch"), None, strict=False)
    assert [issue.type for issue in issues] == ["data_dependent"]
    issue = issues[0]
    assert issue.location is not None
    assert (issue.location.file, issue.location.line) == ("diag_item_branch.py", 9)
    assert issue.details["expression"] == "u0 > 3"
    assert issue.details["symbols"] == ["u0"]
    assert issue.details["assumed"] == "True"
    assert issue.xfail is False
    assert issue.hint is not None and "torch._check(n > 3)" in issue.hint


def test_location_found_after_an_earlier_trace_of_the_same_file() -> None:
    # torch interns file names once per process; the failed export before draft export
    # already interned the fixture, so the draft report alone does not name it
    fixture = load_fixture("diag_data_dependent")
    with pytest.raises(GuardOnDataDependentSymNode):
        torch.export.export(fixture.model, fixture.example_args, strict=False)
    issues = draft_issues(loaded("diag_data_dependent"), None, strict=False)
    assert [issue.type for issue in issues] == ["data_dependent"]
    assert issues[0].location is not None
    assert (issues[0].location.file, issues[0].location.line) == ("diag_data_dependent.py", 8)


def test_missing_fake_kernel_located_from_the_graph() -> None:
    issues = draft_issues(loaded("diag_custom_op"), None, strict=False)
    assert [issue.type for issue in issues] == ["missing_fake_kernel"]
    assert issues[0].details == {"operator": "tp_diag::twice"}
    assert issues[0].location is not None
    assert (issues[0].location.file, issues[0].location.line) == ("diag_custom_op.py", 13)


def test_guard_against_requested_dynamic_shapes() -> None:
    fixture = load_fixture("diag_specialized")
    issues = draft_issues(loaded("diag_specialized"), fixture.dynamic_shapes, strict=False)
    assert [issue.type for issue in issues] == ["guard_added"]
    assert list(issues[0].details["sources"].values()) == ["x.shape[0]"]
    assert issues[0].location is not None
    assert (issues[0].location.file, issues[0].location.line) == ("diag_specialized.py", 9)


def test_draft_export_that_cannot_run_becomes_one_issue() -> None:
    issues = draft_issues(loaded("diag_context_manager"), None, strict=True)
    assert [issue.type for issue in issues] == ["draft_export_failed"]
    assert issues[0].details["code"] == "unsupported_python"
    assert issues[0].location is not None
    assert issues[0].location.line == 10


def test_never_raises_on_bad_inputs() -> None:
    issues = draft_issues(loaded("diag_item_branch", args=("not", "tensors")), None, strict=False)
    assert len(issues) == 1
    assert issues[0].type == "draft_export_failed"
    assert issues[0].details["code"]


def test_clean_model_has_no_issues() -> None:
    issues = draft_issues(loaded("diag_user_raise"), None, strict=True)
    assert issues == []


def test_quiet(capfd: pytest.CaptureFixture[str]) -> None:
    draft_issues(loaded("diag_item_branch"), None, strict=False)
    out, err = capfd.readouterr()
    assert out == ""
    assert err == ""
