"""classify(): real torch 2.13 export failures of small fixtures → contract codes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.diagnostics import exportdb
from engine.diagnostics.classification import classify, essential
from engine.diagnostics.source_map import SourceMap
from engine.errors import ExportError, InvalidRequest
from schemas import ErrorBody
from tests.engine.model_files import MODELS
from tests.engine.model_files import import_model_file as load_fixture

SOURCE_MAP = SourceMap(MODELS)


def export_error(name: str, *, strict: bool, stage: str = "tracing") -> ExportError:
    fixture = load_fixture(name)
    with pytest.raises(Exception) as info:
        torch.export.export(
            fixture.model,
            fixture.example_args,
            dynamic_shapes=getattr(fixture, "dynamic_shapes", None),
            strict=strict,
        )
    return classify(info.value, stage=stage, source_map=SOURCE_MAP)


def assert_clean(error: ExportError) -> None:
    """The body validates, names no server path and carries none of torch's boilerplate."""
    body = ErrorBody.model_validate(error.to_body().model_dump())
    dumped = json.dumps(body.model_dump(mode="json"))
    assert str(MODELS) not in dumped
    assert "TORCH_LOGS" not in body.message
    assert "draft_export()" not in body.message
    assert set(body.exportdb) <= set(exportdb.case_tags())


def assert_location(error: ExportError, file: str, line: int) -> None:
    assert error.location is not None
    assert (error.location.file, error.location.line) == (file, line)


BOTH = pytest.mark.parametrize("strict", [False, True], ids=["nonstrict", "strict"])


def test_export_error_passes_through() -> None:
    error = InvalidRequest("bad")
    assert classify(error, stage="tracing", source_map=SOURCE_MAP) is error


@BOTH
def test_branch_on_tensor_value_is_data_dependent(strict: bool) -> None:
    error = export_error("diag_data_dependent", strict=strict)
    assert error.code == "data_dependent"
    assert error.stage == "tracing"
    assert error.details["branch"] is True
    assert_location(error, "diag_data_dependent.py", 8)
    assert "cond_predicate" in error.exportdb
    assert error.hint is not None and "torch.cond(x.sum() > 0" in error.hint
    assert_clean(error)


@BOTH
def test_guard_on_item_value_is_data_dependent(strict: bool) -> None:
    error = export_error("diag_item_branch", strict=strict)
    assert error.code == "data_dependent"
    assert error.details["expression"] == "u0 > 3"
    assert error.details["symbols"] == ["u0"]
    assert_location(error, "diag_item_branch.py", 9)
    assert error.hint is not None and "torch._check(n > 3)" in error.hint
    assert error.exportdb
    assert_clean(error)


def test_strict_links_the_case_torch_names() -> None:
    # dynamo's UserError for this guard links ExportDB's constrain_as_size_example
    error = export_error("diag_item_branch", strict=True)
    assert error.details["exception_type"] == "UserError"
    assert "constrain_as_size_example" in error.exportdb


@BOTH
def test_specialized_dim_is_a_shape_violation(strict: bool) -> None:
    error = export_error("diag_specialized", strict=strict)
    assert error.code == "dynamic_shape_violation"
    assert error.details["suggested_fixes"] == ["n = 4"]
    assert error.details["dims"] == ["n"]
    assert error.details["specialized"] is True
    assert len(error.details["violations"]) == 1
    assert error.hint is not None and "n = 4" in error.hint
    assert error.exportdb
    if strict:  # only dynamo prints the user stack of the guard
        assert_location(error, "diag_specialized.py", 9)
    assert_clean(error)


@BOTH
def test_related_dims_carry_the_suggested_fixes(strict: bool) -> None:
    error = export_error("diag_derived", strict=strict)
    assert error.code == "dynamic_shape_violation"
    assert error.details["suggested_fixes"] == ["dy = Dim('dy', max=5)", "dx = dy + 1"]
    assert error.details["dims"] == ["dx", "dy"]
    assert error.details["specialized"] is False
    # guard sources read as the user's names, not dynamo's L['x'].size()[0]
    assert any("x.shape[0]" in v for v in error.details["violations"])
    assert not any("L['" in v for v in error.details["violations"])
    assert_clean(error)


def test_context_manager_in_strict_mode_is_unsupported_python() -> None:
    error = export_error("diag_context_manager", strict=True)
    assert error.code == "unsupported_python"
    assert error.details["exception_type"] == "Unsupported"
    assert error.details["graph_break"] == "Attempted to call function marked as skipped"
    assert_location(error, "diag_context_manager.py", 10)
    assert "null_context_manager" in error.exportdb
    assert error.hint is not None and "strict: false" in error.hint
    assert_clean(error)


@BOTH
def test_data_pointer_under_fake_tensors_is_unsupported_python(strict: bool) -> None:
    error = export_error("diag_data_ptr", strict=strict)
    assert error.code == "unsupported_python"
    assert_location(error, "diag_data_ptr.py", 8)
    if strict:
        assert error.details["graph_break"] == "Observed exception"
    else:  # torch raised it, below the user's line
        assert error.details["raised_in_user_code"] is False
        assert error.details["exception_type"] == "RuntimeError"
    assert_clean(error)


def test_user_code_raising_under_tracing_is_the_users_problem() -> None:
    error = export_error("diag_user_raise", strict=False)
    assert error.code == "unsupported_python"
    assert error.details == {"exception_type": "ValueError", "raised_in_user_code": True}
    assert_location(error, "diag_user_raise.py", 9)
    assert_clean(error)


@BOTH
@pytest.mark.parametrize(
    ("fixture", "operator", "line"),
    [("diag_custom_op", "tp_diag::twice", 13), ("diag_library_op", "tp_diag_lib::halve", 12)],
)
def test_custom_op_without_fake_kernel(
    strict: bool, fixture: str, operator: str, line: int
) -> None:
    error = export_error(fixture, strict=strict)
    assert error.code == "missing_fake_kernel"
    assert error.details["operator"] == operator
    assert error.hint is not None and f'register_fake("{operator}")' in error.hint
    assert error.exportdb == ["unsupported_operator"]
    assert_location(error, f"{fixture}.py", line)
    assert_clean(error)


def _exported() -> torch.export.ExportedProgram:
    class Small(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(x) + 1

    return torch.export.export(Small(), (torch.ones(3),))


def test_decomposition_failure() -> None:
    def broken_relu(x: Any) -> Any:
        raise NotImplementedError("no decomposition here")

    ep = _exported()
    with pytest.raises(Exception) as info:
        ep.run_decompositions({torch.ops.aten.relu.default: broken_relu})
    error = classify(info.value, stage="decomposing", source_map=SOURCE_MAP)
    assert error.code == "decomposition_failed"
    assert error.stage == "decomposing"
    assert error.details == {"exception_type": "NotImplementedError"}
    assert error.hint is not None and "preserve" in error.hint
    assert_clean(error)


def test_serialization_failure(tmp_path: Path) -> None:
    ep = _exported()
    with pytest.raises(Exception) as info:
        torch.export.save(ep, tmp_path / "missing-dir" / "program.pt2")
    error = classify(info.value, stage="serializing", source_map=SOURCE_MAP)
    assert error.code == "serialization_failed"
    assert error.stage == "serializing"
    assert error.details["exception_type"] == type(info.value).__name__
    assert_clean(error)


def test_exported_program_raising_in_verification() -> None:
    class Checked(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.max().item()
            torch._check(n > 3)
            return x + n

    ep = torch.export.export(Checked(), (torch.tensor([5, 1]),))
    with pytest.raises(RuntimeError) as info:
        ep.module()(torch.tensor([1, 1]))
    error = classify(info.value, stage="verifying", source_map=SOURCE_MAP)
    assert error.code == "verification_failed"
    assert error.details["exception_type"] == "RuntimeError"
    # a bug of ours while verifying is not the program's failure
    bug = classify(KeyError("samples"), stage="verifying", source_map=SOURCE_MAP)
    assert bug.code == "internal_error"


def test_failure_outside_user_code_is_internal() -> None:
    def ours() -> None:
        raise KeyError("stage table")

    with pytest.raises(KeyError) as info:
        ours()
    error = classify(info.value, stage="tracing", source_map=SOURCE_MAP)
    assert error.code == "internal_error"
    assert error.location is None
    assert error.details == {"exception_type": "KeyError"}
    assert error.exportdb == []


def test_location_from_printed_stack_when_no_frames() -> None:
    # an exception rebuilt from text (e.g. across processes) still points into user code
    path = MODELS / "diag_data_dependent.py"
    exc = RuntimeError(
        "Could not guard on data-dependent expression Eq(u0, 1)\n"
        f'The following call raised this error:\n  File "{path}", line 8, in forward\n'
    )
    error = classify(exc, stage="tracing", source_map=SOURCE_MAP)
    assert error.code == "data_dependent"
    assert error.details["expression"] == "Eq(u0, 1)"
    assert_location(error, "diag_data_dependent.py", 8)


def test_essential_drops_stacks_and_logging_advice() -> None:
    text = (
        "Constraints violated (n)!\n"
        "For more information, run with TORCH_LOGS=dynamic\n"
        "User stack:\n"
        '  File "/srv/x.py", line 3, in forward\n'
        "    return x\n"
        "\n"
        "Suggested fixes:\n"
        "  n = 4\n"
        "The error above occurred when calling torch.export.export. ..."
    )
    kept = essential(text).splitlines()
    assert kept == ["Constraints violated (n)!", "", "Suggested fixes:", "  n = 4"]


# ExportDB matching, against the real db of the installed torch.


def test_exportdb_has_cases() -> None:
    tags = exportdb.case_tags()
    assert "cond_predicate" in tags
    assert "torch.cond" in tags["cond_predicate"]


@pytest.mark.parametrize(
    ("code", "text", "tag"),
    [
        ("data_dependent", "Data-dependent branching", "torch.cond"),
        ("data_dependent", "Could not guard on data-dependent expression u0 > 3", None),
        ("dynamic_shape_violation", "Constraints violated (n)!", "torch.dynamic-shape"),
        ("missing_fake_kernel", "", "torch.operator"),
        ("unsupported_python", "does not support context manager __enter__", None),
    ],
)
def test_cases_for_codes(code: str, text: str, tag: str | None) -> None:
    cases = exportdb.cases_for(code, text)
    tags = exportdb.case_tags()
    assert cases
    assert cases == sorted(cases)
    assert len(cases) <= exportdb.MAX_CASES
    assert set(cases) <= set(tags)
    if tag is not None:
        assert all(tag in tags[name] for name in cases)


def test_cases_for_prefers_the_linked_case_and_is_stable() -> None:
    text = "see https://pytorch.org/docs/main/generated/exportdb/index.html#list-contains"
    cases = exportdb.cases_for("dynamic_shape_violation", text)
    assert "list_contains" in cases
    assert cases == exportdb.cases_for("dynamic_shape_violation", text)


def test_cases_for_codes_without_examples() -> None:
    assert exportdb.cases_for("internal_error", "anything") == []
    assert exportdb.cases_for("serialization_failed") == []
    assert exportdb.linked_case("exportdb/index.html#no-such-case") is None


def _raw_spec_error(spec: dict[str, Any]) -> ExportError:
    """torch's own refusal of an incomplete spec, as a spec torch gets unfilled raises it."""
    fixture = load_fixture("spec_use_cache")
    with pytest.raises(Exception) as info:
        torch.export.export(
            fixture.model, fixture.example_args, fixture.example_kwargs, dynamic_shapes=spec
        )
    return classify(info.value, stage="tracing", source_map=SOURCE_MAP)


def test_a_spec_missing_an_argument_names_it() -> None:
    fixture = load_fixture("spec_use_cache")
    spec = {**fixture.dynamic_shapes, "extra": {"bias": None, "scale": None}}
    error = _raw_spec_error(spec)
    assert error.code == "dynamic_shape_violation"
    assert error.details["missing_keys"] == ["use_cache"]
    assert error.details["unexpected_keys"] == []
    assert error.hint is not None and "`use_cache`" in error.hint
    assert_clean(error)


def test_a_spec_with_other_keys_of_a_dict_input_names_both() -> None:
    fixture = load_fixture("spec_use_cache")
    spec = {**fixture.dynamic_shapes, "use_cache": None, "extra": {"bias": None, "mask": None}}
    error = _raw_spec_error(spec)
    assert error.code == "dynamic_shape_violation"
    assert error.details["missing_keys"] == ["extra.scale"]
    assert error.details["unexpected_keys"] == ["extra.mask"]
    assert error.hint is not None
    assert "`extra.scale`" in error.hint and "`extra.mask`" in error.hint
