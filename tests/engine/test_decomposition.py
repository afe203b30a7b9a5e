"""The decompose stage: modes, preserved ops, the report, and recovery from failing ops."""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from engine.decompose.decomposition import (
    Decomposed,
    decompose,
    is_core_aten,
    keep_until_verified,
    non_core_aten_ops,
    resolve_op,
)
from engine.decompose.shrink import shrink
from engine.diagnostics.source_map import SourceMap
from engine.errors import DecompositionFailed, InvalidRequest
from schemas import DecompositionOptions, DecompositionReport

MODELS = Path(__file__).parent.parent / "models"


@functools.cache
def _fixture(name: str) -> ModuleType:
    # cached: the custom-op fixture registers a torch.library op that must stay alive
    spec = importlib.util.spec_from_file_location(f"decomp_fixture_{name}", MODELS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def _exported(name: str) -> torch.export.ExportedProgram:
    fixture = _fixture(name)
    return torch.export.export(
        fixture.model,
        fixture.example_args,
        getattr(fixture, "example_kwargs", None),
        dynamic_shapes=getattr(fixture, "dynamic_shapes", None),
    )


def _line_of(name: str, text: str) -> int:
    lines = (MODELS / f"{name}.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line)


def _decompose(name: str, **options: object) -> Decomposed:
    return decompose(
        _exported(name),
        DecompositionOptions.model_validate(options),
        source_map=SourceMap(MODELS),
    )


# --- modes and preserved ops ---------------------------------------------------------------


def test_preserved_conv2d_stays_and_batchnorm_is_decomposed() -> None:
    result = _decompose("decomp_conv_bn", preserve=["aten.conv2d.default"])
    report = result.report

    assert report.preserve == ["aten.conv2d.default"]
    assert report.ops_before["aten.conv2d.default"] == 1
    assert report.ops_before["aten.batch_norm.default"] == 1
    assert report.ops_after["aten.conv2d.default"] == 1
    assert "aten.convolution.default" not in report.ops_after
    assert "aten.batch_norm.default" not in report.ops_after
    assert report.ops_after["aten._native_batch_norm_legit_functional.default"] == 1
    assert "aten.batch_norm.default" in report.removed_ops
    assert "aten._native_batch_norm_legit_functional.default" in report.added_ops
    assert result.warnings == []
    assert report.kept_after_failure == []
    graph_targets = {str(n.target) for n in result.ep.graph.nodes if n.op == "call_function"}
    assert "aten.conv2d.default" in graph_targets


def test_conv2d_is_not_core_aten_so_preserving_it_is_reported() -> None:
    # torch 2.13 tags aten.conv2d.default only pt2_compliant; its core form is convolution
    assert is_core_aten(torch.ops.aten.conv2d.default) is False
    assert is_core_aten(torch.ops.aten.convolution.default) is True
    # functional training batchnorm has no core tag either, so it is listed too
    preserved = _decompose("decomp_conv_bn", preserve=["aten.conv2d.default"])
    assert preserved.report.non_core_aten_ops == [
        "aten._native_batch_norm_legit_functional.default",
        "aten.conv2d.default",
    ]
    default = _decompose("decomp_conv_bn")
    assert default.report.ops_after["aten.convolution.default"] == 1
    assert default.report.non_core_aten_ops == ["aten._native_batch_norm_legit_functional.default"]


def test_buffer_mutations_of_train_mode_batchnorm_are_graph_outputs() -> None:
    result = _decompose("decomp_conv_bn", preserve=["aten.conv2d.default"])
    mutated = [
        spec.target
        for spec in result.ep.graph_signature.output_specs
        if spec.kind == torch.export.graph_signature.OutputKind.BUFFER_MUTATION
    ]
    assert mutated == ["bn.running_mean", "bn.running_var", "bn.num_batches_tracked"]


def test_mode_none_returns_the_program_unchanged() -> None:
    ep = _exported("decomp_conv_bn")
    result = decompose(ep, DecompositionOptions(mode="none"))
    assert result.ep is ep
    assert result.report.mode == "none"
    assert result.report.ops_after == result.report.ops_before
    assert result.report.removed_ops == [] and result.report.added_ops == []
    assert "aten.batch_norm.default" in result.report.non_core_aten_ops


def test_mode_custom_decomposes_only_the_listed_ops() -> None:
    # the custom op would fail to decompose; custom mode never touches it
    result = _decompose("decomp_custom_op", mode="custom", decompose=["aten.linear.default"])
    after = result.report.ops_after
    assert "aten.linear.default" not in after
    assert after["aten.addmm.default"] == 1
    assert after["aten.layer_norm.default"] == 1
    assert after["tp_decomp.grow_shrink.default"] == 1
    assert result.report.kept_after_failure == []
    assert result.warnings == []


def test_mode_custom_reaches_decompositions_outside_the_core_table() -> None:
    # relu is core (not in the default table) but torch has a decomposition for it
    result = _decompose(
        "decomp_conv_bn", mode="custom", decompose=["aten.conv2d.default", "aten.relu.default"]
    )
    assert result.report.ops_after["aten.convolution.default"] == 1
    assert "aten.relu.default" in result.report.removed_ops
    assert result.warnings == []


def test_mode_custom_warns_about_ops_without_a_decomposition() -> None:
    result = _decompose(
        "decomp_conv_bn",
        mode="custom",
        decompose=["aten.conv2d.default", "aten.convolution.default"],
    )
    assert result.report.ops_after["aten.convolution.default"] == 1
    assert [w.code for w in result.warnings] == ["decomposition_unavailable"]
    assert result.warnings[0].details == {"ops": ["aten.convolution.default"]}


@pytest.mark.parametrize(
    ("field", "name"),
    [
        ("preserve", "aten.not_an_op.default"),
        ("preserve", "aten.conv2d.no_such_overload"),
        ("preserve", "conv2d"),
        ("decompose", "nowhere.op.default"),
    ],
)
def test_unknown_op_names_are_invalid_requests(field: str, name: str) -> None:
    options: dict[str, object] = {field: [name]}
    if field == "decompose":
        options["mode"] = "custom"
    with pytest.raises(InvalidRequest) as caught:
        _decompose("decomp_conv_bn", **options)
    assert caught.value.code == "invalid_request"
    assert caught.value.stage == "decomposing"
    assert caught.value.details == {"op": name}


@pytest.mark.parametrize("name", ["aten.conv2d.default", "aten::conv2d", "aten.conv2d"])
def test_op_names_resolve_in_the_usual_spellings(name: str) -> None:
    assert resolve_op(name) is torch.ops.aten.conv2d.default


def test_report_is_valid_json_of_the_contract() -> None:
    report = _decompose("decomp_conv_bn", preserve=["aten.conv2d.default"]).report
    assert DecompositionReport.model_validate(report.model_dump(mode="json")) == report


def test_subgraph_ops_are_counted_and_higher_order_ops_are_not_aten() -> None:
    result = _decompose("doc_nested")
    assert result.report.ops_after["aten.sin.default"] == 1  # inside the cond branch
    assert result.report.ops_after["higher_order.cond"] == 1
    assert result.report.non_core_aten_ops == []
    assert non_core_aten_ops(_exported("doc_nested").graph_module) == [
        "aten.linear.default",
        "aten.sum.default",
    ]


# --- failing decompositions ----------------------------------------------------------------


def test_failing_custom_op_is_kept_alone_and_warned_about() -> None:
    result = _decompose("decomp_custom_op")
    report = result.report

    assert report.kept_after_failure == ["tp_decomp.grow_shrink.default"]
    assert [w.code for w in result.warnings] == ["decomposition_ops_kept"]
    assert result.warnings[0].details == {
        "ops": ["tp_decomp.grow_shrink.default"],
        "reason": "decomposition_failed",
    }
    # the other decomposable ops were still decomposed
    assert "aten.linear.default" not in report.ops_after
    assert "aten.layer_norm.default" not in report.ops_after
    assert report.ops_after["tp_decomp.grow_shrink.default"] == 1
    assert report.non_core_aten_ops == ["tp_decomp.grow_shrink.default"]
    # and the program still computes what the model does
    fixture = _fixture("decomp_custom_op")
    with torch.no_grad():
        expected = fixture.model(*fixture.example_args)
        actual = result.ep.module()(*fixture.example_args)
    torch.testing.assert_close(actual, expected)


def test_failing_op_without_keep_failing_ops_is_decomposition_failed() -> None:
    with pytest.raises(DecompositionFailed) as caught:
        _decompose("decomp_custom_op", keep_failing_ops=False)
    error = caught.value
    assert error.code == "decomposition_failed"
    assert error.stage == "decomposing"
    assert error.details["ops"] == ["tp_decomp.grow_shrink.default"]
    assert error.details["exception"] == "RuntimeError"
    assert error.details["node"] == "grow_shrink"
    assert error.location is not None
    assert error.location.file == "decomp_custom_op.py"
    assert error.location.line == _line_of("decomp_custom_op", "y = torch.ops.tp_decomp")


def test_failure_no_kept_op_can_fix_is_decomposition_failed() -> None:
    with pytest.raises(DecompositionFailed) as caught:
        _decompose("decomp_resize_inline")
    error = caught.value
    assert error.code == "decomposition_failed"
    assert error.details["exception"] == "RuntimeError"
    assert error.details["node_target"] == "aten.slice.Tensor"
    assert "aten.linear.default" in error.details["ops"]
    assert error.location is not None
    assert error.location.file == "decomp_resize_inline.py"
    assert error.location.line == _line_of("decomp_resize_inline", "copy_(x.flatten())")
    assert error.to_body().code == "decomposition_failed"


# --- decomposed programs that fail verification ---------------------------------------------


class Mixed(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.norm(torch.nn.functional.silu(self.linear(x))))


def _targets(ep: torch.export.ExportedProgram) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def test_ops_kept_until_the_program_verifies_are_a_minimal_set() -> None:
    ep = torch.export.export(Mixed(), (torch.randn(2, 8),))
    opts = DecompositionOptions()
    decomposed = decompose(ep, opts)
    needed = {"aten.silu.default", "aten.layer_norm.default"}
    trials: list[set[str]] = []

    def passes(trial: torch.export.ExportedProgram) -> bool:
        # stands in for verification: only programs that kept both ops "verify"
        trials.append(_targets(trial))
        return needed <= _targets(trial)

    kept = keep_until_verified(ep, opts, decomposed, passes, failure="outputs differ")
    assert kept is not None
    assert kept.report.kept_after_failure == sorted(needed)
    assert needed <= _targets(kept.ep)
    # the ops not needed were still decomposed
    assert "aten.linear.default" not in kept.report.ops_after
    assert [w.code for w in kept.warnings] == ["decomposition_ops_kept"]
    assert kept.warnings[0].details == {
        "ops": sorted(needed),
        "reason": "verification_failed",
        "failure": "outputs differ",
    }
    assert 1 < len(trials) <= 8  # all candidates first, then delta debugging


def test_no_set_of_kept_ops_that_verifies_is_none() -> None:
    ep = torch.export.export(Mixed(), (torch.randn(2, 8),))
    opts = DecompositionOptions()
    decomposed = decompose(ep, opts)
    assert keep_until_verified(ep, opts, decomposed, lambda _: False, failure="x") is None


def test_the_op_a_raising_decomposed_program_fails_at_is_tried_first() -> None:
    pytest.importorskip("diffusers")
    from tests.engine.model_files import import_model_file

    vae = import_model_file("hf_vae")
    ep = torch.export.export(vae.model, vae.example_args, strict=False)
    opts = DecompositionOptions()
    decomposed = decompose(ep, opts)
    with pytest.raises(RuntimeError, match="is_contiguous"), torch.no_grad():
        decomposed.ep.module()(*vae.example_args)
    trials = []

    def passes(trial: torch.export.ExportedProgram) -> bool:
        trials.append(trial)
        with torch.no_grad():
            trial.module()(*vae.example_args)  # raises for a set that does not help
        return True

    kept = keep_until_verified(
        ep, opts, decomposed, passes, failure="raised", example=(vae.example_args, {})
    )
    assert kept is not None
    assert kept.report.kept_after_failure == ["aten.group_norm.default"]
    assert len(trials) == 1  # found from the failing node, no search
    assert kept.report.ops_after["aten.group_norm.default"] > 0
    assert "aten.conv2d.default" not in kept.report.ops_after


def test_shrink_finds_a_one_minimal_set() -> None:
    needed = {"b", "e"}
    calls: list[list[str]] = []

    def passes(trial: list[str]) -> bool:
        calls.append(trial)
        return needed <= set(trial)

    assert shrink(list("abcdefgh"), passes) == ["b", "e"]
    assert all(trial for trial in calls)  # the empty set is known to fail, never tried


def test_shrink_keeps_a_set_where_every_element_is_needed() -> None:
    assert shrink(["x", "y", "z"], lambda trial: len(trial) == 3) == ["x", "y", "z"]
    assert shrink(["only"], lambda trial: False) == ["only"]


class _Recurrent(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.gru = torch.nn.GRU(4, 8, 2, batch_first=True)
        self.lstm = torch.nn.LSTM(8, 8, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(self.gru(x)[0])[0]


@pytest.mark.parametrize("unroll", [False, True])
def test_recurrent_layers_stay_whole_unless_unrolling_is_asked_for(unroll: bool) -> None:
    module = _Recurrent().eval()
    x = torch.randn(2, 5, 4)
    ep = torch.export.export(module, (x,))
    result = decompose(ep, DecompositionOptions(unroll_recurrent=unroll))
    after = result.report.ops_after
    recurrent = {"aten.gru.input", "aten.lstm.input"}
    torch.testing.assert_close(result.ep.module()(x), module(x))
    if unroll:
        assert not recurrent & set(after)
        assert result.warnings == []
        return
    assert {op: after[op] for op in recurrent} == {"aten.gru.input": 1, "aten.lstm.input": 1}
    assert recurrent <= set(result.report.non_core_aten_ops)
    assert [(w.code, w.details) for w in result.warnings] == [
        (
            "recurrent_ops_kept",
            {"ops": sorted(recurrent), "counts": {"aten.gru.input": 1, "aten.lstm.input": 1}},
        )
    ]


def test_recurrent_layers_are_decomposed_when_custom_mode_lists_them() -> None:
    ep = torch.export.export(_Recurrent().eval(), (torch.randn(2, 5, 4),))
    result = decompose(ep, DecompositionOptions(mode="custom", decompose=["aten.gru.input"]))
    assert "aten.gru.input" not in result.report.ops_after
    assert result.report.ops_after["aten.lstm.input"] == 1
    assert result.warnings == []
