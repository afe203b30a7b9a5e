"""The tracing stage: attempts, strict fallback, dynamic-shape fixes and the report."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from engine.diagnostics.source_map import SourceMap
from engine.errors import ExportError, InvalidRequest
from engine.load.model import LoadedModel
from engine.trace.tracing import MAX_FIX_ROUNDS, Traced, trace
from schemas import ExportOptions, TracingReport

MODELS = Path(__file__).parent.parent / "models"


def _fixture(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"trace_fixture_{name}", MODELS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _loaded(name: str) -> LoadedModel:
    fixture = _fixture(name)
    return LoadedModel(
        module=fixture.model,
        args=fixture.example_args,
        kwargs=getattr(fixture, "example_kwargs", {}),
        source_map=SourceMap(MODELS),
        entry=f"{name}.py",
        module_name=fixture.__name__,
        module_dynamic_shapes=getattr(fixture, "dynamic_shapes", None),
    )


def _options(**fields: Any) -> ExportOptions:
    return ExportOptions.model_validate(fields)


def _ranges(traced: Traced) -> list[tuple[str, str]]:
    return sorted((str(r.lower), str(r.upper)) for r in traced.ep.range_constraints.values())


def _dumped(report: TracingReport) -> dict[str, Any]:
    return report.model_dump(mode="json", exclude_none=True)


def _failure(loaded: LoadedModel, options: ExportOptions, spec: Any, source: str) -> ExportError:
    with pytest.raises(ExportError) as caught:
        trace(loaded, options, spec, source)
    return caught.value


DERIVED_REQUESTED = {"x": {"0": {"name": "dx", "min": 3, "max": 6}}, "y": {"0": {"name": "dy"}}}
DERIVED_APPLIED = {"x": {"0": {"name": "dx", "min": 3, "max": 6}}, "y": {"0": "dx+1"}}


def test_auto_fix_applies_torch_suggestions_and_retries() -> None:
    traced = trace(_loaded("trace_derived"), _options(), DERIVED_REQUESTED, "options")
    report = _dumped(traced.report)
    shapes = report["dynamic_shapes"]
    assert shapes["source"] == "options"
    assert shapes["requested"] == DERIVED_REQUESTED
    assert shapes["applied"] == DERIVED_APPLIED
    assert shapes["fixes"] == [{"text": "dy = dx + 1", "name": "dy", "spec": "dx+1"}]
    assert [(a["strict"], a["succeeded"]) for a in report["attempts"]] == [
        (False, False),
        (False, True),
    ]
    assert report["attempts"][0]["dynamic_shapes"] == DERIVED_REQUESTED
    assert report["attempts"][0]["error"]["stage"] == "tracing"
    assert report["attempts"][0]["error"]["code"] == "dynamic_shape_violation"
    assert report["attempts"][1]["dynamic_shapes"] == DERIVED_APPLIED
    assert report["strict_used"] is False
    assert _ranges(traced) == [("3", "6"), ("4", "7")]


def test_module_spec_is_fixed_and_reported_in_json() -> None:
    loaded = _loaded("trace_derived")
    traced = trace(loaded, _options(), loaded.module_dynamic_shapes, "module")
    shapes = _dumped(traced.report)["dynamic_shapes"]
    assert shapes["source"] == "module"
    assert shapes["requested"] == DERIVED_REQUESTED
    assert shapes["applied"] == DERIVED_APPLIED


def test_auto_fix_off_raises_and_records_the_attempt() -> None:
    error = _failure(
        _loaded("trace_derived"),
        _options(auto_fix_dynamic_shapes=False),
        DERIVED_REQUESTED,
        "options",
    )
    report: TracingReport = error.tracing_report  # type: ignore[attr-defined]
    assert len(report.attempts) == 1
    attempt = report.attempts[0]
    assert attempt.succeeded is False
    assert attempt.error == error.to_body()
    assert (error.code, error.stage) == ("dynamic_shape_violation", "tracing")
    assert report.strict_used is None
    assert report.dynamic_shapes.fixes == []
    assert _dumped(report)["dynamic_shapes"]["applied"] == DERIVED_REQUESTED


def test_int_specialization_is_fixed_to_a_static_size() -> None:
    traced = trace(_loaded("trace_specialized"), _options(), {"x": {"0": {"name": "b"}}}, "options")
    shapes = _dumped(traced.report)["dynamic_shapes"]
    assert shapes["applied"] == {"x": {"0": 4}}
    assert shapes["fixes"] == [{"text": "b = 4", "name": "b", "spec": 4}]
    assert traced.ep.range_constraints == {}


def test_even_dim_fix_declares_a_new_root_with_expr() -> None:
    loaded = _loaded("trace_even")
    traced = trace(loaded, _options(), {"x": {"0": {"name": "b"}}}, "options")
    applied = _dumped(traced.report)["dynamic_shapes"]["applied"]
    assert applied == {"x": {"0": {"name": "_b", "min": 1, "expr": "2*_b"}}}
    # the applied spec is itself a valid request that exports at once
    again = trace(loaded, _options(), applied, "options")
    assert len(again.report.attempts) == 1
    assert again.report.attempts[0].succeeded is True


def test_shared_batch_dim_gives_one_symbol() -> None:
    spec = {"x": {"0": {"name": "batch", "max": 64}}, "y": {"0": "batch"}}
    traced = trace(_loaded("trace_shared_batch"), _options(), spec, "options")
    assert len(traced.ep.range_constraints) == 1
    assert _ranges(traced)[0][1] == "64"
    assert [a.succeeded for a in traced.report.attempts] == [True]
    assert _dumped(traced.report)["dynamic_shapes"]["applied"] == spec


def test_auto_makes_every_dim_dynamic_where_the_code_allows() -> None:
    traced = trace(_loaded("trace_shared_batch"), _options(), "auto", "options")
    shapes = _dumped(traced.report)["dynamic_shapes"]
    assert shapes["requested"] == "auto"
    assert shapes["applied"] == {"x": {"0": "auto", "1": "auto"}, "y": {"0": "auto", "1": "auto"}}
    # batch is shared and dynamic; the feature dim is pinned to 4 by the Linear layer
    assert len(traced.ep.range_constraints) == 1
    placeholder = next(n for n in traced.ep.graph.nodes if n.op == "placeholder" and n.name == "x")
    assert isinstance(placeholder.meta["val"].shape[0], torch.SymInt)
    assert placeholder.meta["val"].shape[1] == 4


def test_nested_inputs_and_keyword_argument() -> None:
    spec = {
        "xs": [{"0": {"name": "n", "max": 16}}, {"0": "n"}],
        "d": {"a": {"0": "n"}},
        "scale": {"0": "n", "1": 4},
    }
    traced = trace(_loaded("trace_nested"), _options(), spec, "options")
    assert len(traced.ep.range_constraints) == 1
    assert _ranges(traced)[0][1] == "16"
    assert _dumped(traced.report)["dynamic_shapes"]["applied"] == {
        "xs": [{"0": {"name": "n", "max": 16}}, {"0": "n"}],
        "d": {"a": {"0": "n"}},
        "scale": {"0": "n", "1": 4},
    }


def test_strict_auto_falls_back_to_non_strict() -> None:
    traced = trace(_loaded("trace_strict_unsupported"), _options(strict="auto"), None, "none")
    attempts = traced.report.attempts
    assert [(a.strict, a.succeeded) for a in attempts] == [(True, False), (False, True)]
    assert attempts[0].error is not None
    assert (attempts[0].error.code, attempts[0].error.stage) == ("unsupported_python", "tracing")
    assert traced.report.strict_used is False
    assert traced.report.dynamic_shapes.source == "none"


def test_strict_only_fails_with_one_attempt() -> None:
    error = _failure(_loaded("trace_strict_unsupported"), _options(strict=True), None, "none")
    report: TracingReport = error.tracing_report  # type: ignore[attr-defined]
    assert [(a.strict, a.succeeded) for a in report.attempts] == [(True, False)]


def test_strict_auto_stops_at_strict_when_it_succeeds() -> None:
    spec = {"x": {"0": {"name": "batch", "max": 64}}, "y": {"0": "batch"}}
    traced = trace(_loaded("trace_shared_batch"), _options(strict="auto"), spec, "options")
    assert [(a.strict, a.succeeded) for a in traced.report.attempts] == [(True, True)]
    assert traced.report.strict_used is True


def test_invalid_spec_raises_before_any_attempt_with_its_report() -> None:
    with pytest.raises(InvalidRequest) as caught:
        trace(_loaded("trace_derived"), _options(), {"x": {"0": "nope"}}, "options")
    assert caught.value.details == {"path": "x.0", "reason": "undeclared_dim", "name": "nope"}
    report: TracingReport = caught.value.tracing_report  # type: ignore[attr-defined]
    assert report.attempts == []
    assert report.dynamic_shapes.requested == {"x": {"0": "nope"}}


def test_fix_rounds_are_bounded() -> None:
    # a spec with a dynamic dim the code pins to a constant has no applicable fix
    # for Dim.DYNAMIC, so export is tried once per mode and then gives up
    error = _failure(
        _loaded("trace_specialized"), _options(strict="auto"), {"x": {"0": "dynamic"}}, "options"
    )
    report: TracingReport = error.tracing_report  # type: ignore[attr-defined]
    assert [(a.strict, a.succeeded) for a in report.attempts] == [(True, False), (False, False)]
    assert len(report.attempts) <= 2 * (MAX_FIX_ROUNDS + 1)


def test_no_spec_exports_static() -> None:
    traced = trace(_loaded("trace_derived"), _options(), None, "none")
    assert traced.ep.range_constraints == {}
    assert traced.report.dynamic_shapes.requested is None
    assert traced.report.dynamic_shapes.applied is None


def test_spec_outside_the_grammar_still_raises_invalid_request() -> None:
    with pytest.raises(InvalidRequest) as caught:
        trace(_loaded("trace_derived"), _options(), {"x": {"0": 2.5}}, "options")
    assert caught.value.details == {"path": "x.0", "reason": "invalid_dim"}
    report: TracingReport = caught.value.tracing_report  # type: ignore[attr-defined]
    assert (report.attempts, report.dynamic_shapes.source) == ([], "options")


# the module's spec and the same spec as JSON: what either leaves out is static
USE_CACHE_JSON = {
    "input_ids": {"0": {"name": "batch", "max": 64}},
    "attention_mask": {"0": "batch"},
    "extra": {"bias": {"0": "batch"}},
}


def test_module_spec_leaving_out_keys_traces_as_the_same_json_spec_does() -> None:
    loaded = _loaded("spec_use_cache")
    from_module = trace(loaded, _options(), loaded.module_dynamic_shapes, "module")
    from_json = trace(loaded, _options(), USE_CACHE_JSON, "options")
    applied = _dumped(from_module.report)["dynamic_shapes"]["applied"]
    assert applied == _dumped(from_json.report)["dynamic_shapes"]["applied"]
    assert applied["use_cache"] is None
    assert applied["extra"] == {"bias": {"0": "batch"}, "scale": None}
    assert _ranges(from_module) == _ranges(from_json) == [("0", "64")]


@pytest.mark.parametrize("source", ["module", "options"])
def test_a_list_spec_short_of_entries_names_them_in_both_forms(source: str) -> None:
    loaded = _loaded("trace_nested")
    short = {"module": {"xs": [{0: torch.export.Dim("b")}]}, "options": {"xs": [None]}}[source]
    with pytest.raises(InvalidRequest) as caught:
        trace(loaded, _options(), short, source)
    details = caught.value.details
    assert (details["path"], details["reason"]) == ("xs", "structure_mismatch")
    assert details["missing"] == ["xs.1"]
    assert caught.value.hint is not None and "`xs.1`" in caught.value.hint
