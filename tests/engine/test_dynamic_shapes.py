"""The dynamic-shapes grammar: JSON → torch, torch → JSON, and torch's suggested fixes."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from torch.export import Dim
from torch.export.dynamic_shapes import _DerivedDim

from engine.errors import InvalidRequest
from engine.shapes.grammar import REASONS, to_torch
from engine.shapes.json_form import apply_fixes, fix_to_json, suggested_fixes, to_json
from schemas import DynamicShapeFix, ExportOptions, dynamic_shapes_adapter


class TwoInputs(torch.nn.Module):
    def forward(self, x, y):
        return x[1:] + y


class Mixed(torch.nn.Module):
    def forward(self, x, xs, d=None, *, n, w):
        return x


class VarKeyword(torch.nn.Module):
    def forward(self, x, **extra):
        return x + extra["mask"]


TWO = (torch.randn(5, 3), torch.randn(4, 3))
MIXED_ARGS = (torch.randn(6, 3), [torch.randn(6), torch.randn(2, 3)], {"a": torch.randn(7, 4)})
MIXED_KWARGS = {"n": 3, "w": torch.randn(2, 2)}


def _mixed(spec: Any) -> Any:
    return to_torch(spec, Mixed(), MIXED_ARGS, MIXED_KWARGS)


def _export_error(module: torch.nn.Module, args: tuple[Any, ...], spec: Any) -> str:
    with pytest.raises(Exception) as caught:
        torch.export.export(module, args, dynamic_shapes=spec)
    return str(caught.value)


# --------------------------------------------------------------------------- JSON → torch


def test_shared_named_dim_is_one_torch_dim() -> None:
    spec = to_torch(
        {"x": {"0": {"name": "batch", "min": 2, "max": 64}}, "y": {"0": "batch"}},
        TwoInputs(),
        (torch.randn(5, 3), torch.randn(5, 3)),
        {},
    )
    assert spec["x"][0] is spec["y"][0]
    assert (spec["x"][0].__name__, spec["x"][0].min, spec["x"][0].max) == ("batch", 2, 64)
    assert spec["x"].keys() == {0}


def test_reference_before_declaration_resolves() -> None:
    spec = to_torch(
        {"y": {"0": "dimx-1"}, "x": {"0": {"name": "dimx", "min": 3, "max": 6}}},
        TwoInputs(),
        TWO,
        {},
    )
    derived = spec["y"][0]
    assert isinstance(derived, _DerivedDim)
    assert derived.root is spec["x"][0]
    assert (derived.min, derived.max) == (2, 5)


@pytest.mark.parametrize(
    ("text", "size", "bounds"),
    [
        ("2*b", 10, (2, 20)),
        ("b+1", 6, (2, 11)),
        ("2*b+1", 11, (3, 21)),
        ("b-1", 4, (0, 9)),
        ("3 * b + 2", 17, (5, 32)),
    ],
)
def test_derived_dims(text: str, size: int, bounds: tuple[int, int]) -> None:
    spec = to_torch(
        {"x": {"0": {"name": "b", "min": 1, "max": 10}}, "y": {"0": text}},
        TwoInputs(),
        (torch.randn(5, 3), torch.randn(size, 3)),
        {},
    )
    derived = spec["y"][0]
    assert derived.root is spec["x"][0]
    assert (derived.min, derived.max) == bounds


def test_keywords_ints_and_lists() -> None:
    spec = to_torch([["auto", 3], {"1": "dynamic", "0": "static"}], TwoInputs(), TWO, {})
    assert spec == [[Dim.AUTO, 3], {1: Dim.DYNAMIC, 0: Dim.STATIC}]


def test_auto_covers_every_tensor_dim_of_every_input() -> None:
    spec = _mixed("auto")
    assert spec == {
        "x": {0: Dim.AUTO, 1: Dim.AUTO},
        "xs": [{0: Dim.AUTO}, {0: Dim.AUTO, 1: Dim.AUTO}],
        "d": {"a": {0: Dim.AUTO, 1: Dim.AUTO}},
        "n": None,
        "w": {0: Dim.AUTO, 1: Dim.AUTO},
    }


def test_nested_inputs_and_kwargs() -> None:
    spec = _mixed(
        {
            "xs": [{"0": "b"}, None],
            "x": [{"name": "b", "max": 32}, None],
            "d": {"a": {"1": "auto"}},
            "w": {"0": "static"},
            "n": "dynamic",
        }
    )
    batch = spec["x"][0]
    assert spec == {
        "x": [batch, None],
        "xs": [{0: batch}, None],
        "d": {"a": {1: Dim.AUTO}},
        "n": Dim.DYNAMIC,
        "w": {0: Dim.STATIC},
    }


def test_var_keyword_arguments_are_named_directly() -> None:
    spec = to_torch(
        {"mask": {"0": "auto"}},
        VarKeyword(),
        (torch.randn(2),),
        {"mask": torch.randn(2)},
    )
    assert spec == {"x": None, "extra": {"mask": {0: Dim.AUTO}}}


def test_spec_parsed_by_the_options_model() -> None:
    options = ExportOptions.model_validate(
        {"dynamic_shapes": {"x": {"0": {"name": "dimx", "min": 3, "max": 6}}, "y": {"0": "dimx-1"}}}
    )
    spec = to_torch(options.dynamic_shapes, TwoInputs(), TWO, {})
    assert spec["x"][0].__name__ == "dimx"
    assert spec["y"][0].root is spec["x"][0]


def test_converted_spec_exports() -> None:
    spec = to_torch(
        {"x": {"0": {"name": "dimx", "min": 3, "max": 6}}, "y": {"0": "dimx-1"}},
        TwoInputs(),
        TWO,
        {},
    )
    ep = torch.export.export(TwoInputs(), TWO, dynamic_shapes=spec)
    ranges = sorted((r.lower, r.upper) for r in ep.range_constraints.values())
    assert ranges == [(2, 5), (3, 6)]


INVALID = [
    ("batch", TWO, "", "invalid_spec"),
    ({"z": None}, TWO, "z", "unknown_argument"),
    ([None, None, None], TWO, "2", "too_many_arguments"),
    ({"x": {"a": "auto"}}, TWO, "x.a", "invalid_dim_index"),
    ({"x": {"2": "auto"}}, TWO, "x.2", "dim_out_of_range"),
    ({"x": ["auto"]}, TWO, "x", "rank_mismatch"),
    ({"x": 3}, TWO, "x", "invalid_spec"),
    ({"x": {"0": 2.5}}, TWO, "x.0", "invalid_dim"),
    ({"x": {"0": True}}, TWO, "x.0", "invalid_dim"),
    ({"x": {"0": {"name": "1b"}}}, TWO, "x.0", "invalid_dim"),
    ({"x": {"0": "b +"}}, TWO, "x.0", "invalid_dim_expression"),
    ({"x": {"0": {"name": "b", "min": 6, "max": 6}}}, TWO, "x.0", "invalid_range"),
    ({"x": {"0": {"name": "b", "min": -1}}}, TWO, "x.0", "invalid_range"),
    ({"x": {"0": {"name": "auto"}}}, TWO, "x.0", "reserved_name"),
    ({"x": {"0": {"name": "b"}}, "y": {"0": {"name": "b"}}}, TWO, "y.0", "duplicate_dim"),
    ({"x": {"0": {"name": "b"}}, "y": {"0": "c+1"}}, TWO, "y.0", "undeclared_dim"),
    ({"y": {"1": "batch"}}, TWO, "y.1", "undeclared_dim"),
    ({"x": {"1": 4}}, TWO, "x.1", "static_size_mismatch"),
    ({"x": {"0": {"name": "b", "max": 4}}}, TWO, "x.0", "size_out_of_range"),
    ({"x": {"0": {"name": "b"}}, "y": {"0": "b-1"}}, TWO, "y.0", "derived_dim_negative"),
    ({"x": {"0": {"name": "b"}}, "y": {"0": "0*b"}}, TWO, "y.0", "invalid_dim_expression"),
    ({"x": {"0": {"name": "b", "expr": "2*c"}}}, TWO, "x.0", "invalid_dim_expression"),
]


@pytest.mark.parametrize(("spec", "args", "path", "reason"), INVALID)
def test_invalid_specs_name_path_and_reason(
    spec: Any, args: tuple[Any, ...], path: str, reason: str
) -> None:
    with pytest.raises(InvalidRequest) as caught:
        to_torch(spec, TwoInputs(), args, {})
    assert caught.value.stage == "tracing"
    assert (caught.value.details["path"], caught.value.details["reason"]) == (path, reason)
    assert reason in REASONS


@pytest.mark.parametrize(
    ("spec", "path", "reason"),
    [
        ({"d": {"b": None}}, "d.b", "unknown_key"),
        ({"d": [None]}, "d", "structure_mismatch"),
        ({"xs": [None]}, "xs", "structure_mismatch"),
        ({"n": {"0": "auto"}}, "n", "not_a_tensor"),
        ({"xs": [{"1": "auto"}, None]}, "xs.0.1", "dim_out_of_range"),
        ({"d": {"a": {"0": 6}}}, "d.a.0", "static_size_mismatch"),
    ],
)
def test_invalid_nested_specs(spec: Any, path: str, reason: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        _mixed(spec)
    assert (caught.value.details["path"], caught.value.details["reason"]) == (path, reason)


def test_argument_in_signature_without_example_input() -> None:
    with pytest.raises(InvalidRequest) as caught:
        to_torch({"d": None}, Mixed(), MIXED_ARGS[:2], MIXED_KWARGS)
    assert caught.value.details == {"path": "d", "reason": "argument_not_given"}


def test_every_reason_is_exercised() -> None:
    covered = {case[3] for case in INVALID} | {
        "unknown_key",
        "structure_mismatch",
        "not_a_tensor",
        "argument_not_given",
    }
    assert covered == set(REASONS)


# --------------------------------------------------------------------------- torch → JSON


def test_to_json_declares_first_occurrence_only() -> None:
    batch = Dim("batch", min=2, max=64)
    spec = {"x": {0: batch, 1: 3}, "y": (batch, Dim.AUTO, None), "z": [{0: 2 * batch + 1}]}
    assert to_json(spec) == {
        "x": {"0": {"name": "batch", "min": 2, "max": 64}, "1": 3},
        "y": ["batch", "auto", None],
        "z": [{"0": "2*batch+1"}],
    }


def test_to_json_declares_a_root_used_only_derived_with_expr() -> None:
    half = Dim("half", min=1)
    assert to_json({"x": {0: 2 * half, 1: half * 2 - 1}}) == {
        "x": {"0": {"name": "half", "min": 1, "expr": "2*half"}, "1": "2*half-1"}
    }


def test_to_json_of_hints_and_defaults() -> None:
    assert to_json([{0: Dim.DYNAMIC, 1: Dim.STATIC}, {0: Dim("d")}]) == [
        {"0": "dynamic", "1": "static"},
        {"0": {"name": "d"}},
    ]


def test_to_json_refuses_what_is_not_a_spec() -> None:
    with pytest.raises(ValueError):
        to_json({"x": {0: 1.5}})


CANONICAL = [
    {"x": {"0": {"name": "dimx", "min": 3, "max": 6}}, "y": {"0": "dimx-1"}},
    {"x": [{"name": "b", "min": 2, "max": 8}, 3], "y": ["b-1", "static"]},
    [{"0": {"name": "h", "min": 2, "expr": "2*h+1"}}, {"1": "dynamic"}],
    {"x": {"0": "auto", "1": "auto"}, "y": None},
]


@pytest.mark.parametrize("spec", CANONICAL)
def test_round_trip_of_canonical_specs(spec: Any) -> None:
    sizes = (torch.randn(5, 3), torch.randn(4, 3))
    torch_spec = to_torch(spec, TwoInputs(), sizes, {})
    assert to_json(torch_spec) == spec
    assert dynamic_shapes_adapter.validate_python(spec) is not None


def _random_dim(rng: random.Random, size: int, declared: dict[str, tuple[int, int]]) -> Any:
    """A random dim spec that fits an example dim of `size`."""
    choice = rng.randrange(6)
    if choice == 0:
        return size
    if choice == 1:
        return rng.choice(["auto", "dynamic", "static"])
    if choice == 2 and declared:
        # a reference or derived dim of an already declared root fitting `size`
        for name, (root_size, _) in declared.items():
            for coeff in (1, 2, 3):
                offset = size - coeff * root_size
                if coeff * declared[name][1] + offset >= 0 and abs(offset) <= 3:
                    text = f"{coeff}*{name}" if coeff != 1 else name
                    text += f"+{offset}" if offset > 0 else (f"-{-offset}" if offset else "")
                    return text
    if choice in (2, 3):
        name = f"d{len(declared)}"
        low = rng.choice([None, *range(min(size, 2) + 1)])
        high = rng.choice([None, size + rng.randrange(1, 5)])
        declared[name] = (size, low or 0)
        decl: dict[str, Any] = {"name": name}
        if low:
            decl["min"] = low
        if high is not None:
            decl["max"] = high
        return decl
    return None


def test_round_trip_property_on_random_specs() -> None:
    rng = random.Random(1234)
    for _ in range(300):
        shapes = [[rng.randint(1, 9) for _ in range(rng.randint(1, 3))] for _ in range(2)]
        args = tuple(torch.empty(shape) for shape in shapes)
        declared: dict[str, tuple[int, int]] = {}
        spec: dict[str, Any] = {}
        for name, shape in zip(("x", "y"), shapes, strict=True):
            if rng.random() < 0.5:
                spec[name] = {str(i): _random_dim(rng, s, declared) for i, s in enumerate(shape)}
            else:
                spec[name] = [_random_dim(rng, s, declared) for s in shape]
        torch_spec = to_torch(spec, TwoInputs(), args, {})
        assert to_json(torch_spec) == spec
        assert to_json(to_torch(to_json(torch_spec), TwoInputs(), args, {})) == spec


# --------------------------------------------------------------------------- suggested fixes


def test_suggested_fixes_of_a_real_constraint_violation() -> None:
    message = _export_error(
        TwoInputs(), TWO, {"x": {0: Dim("dimx", min=3, max=6)}, "y": {0: Dim("dimy")}}
    )
    assert suggested_fixes(message) == ["dimy = Dim('dimy', max=5)", "dimx = dimy + 1"]
    assert [fix_to_json(line) for line in suggested_fixes(message)] == [
        DynamicShapeFix(
            text="dimy = Dim('dimy', max=5)", name="dimy", spec={"name": "dimy", "max": 5}
        ),
        DynamicShapeFix(text="dimx = dimy + 1", name="dimx", spec="dimy+1"),
    ]


def test_apply_fixes_to_the_spec_that_failed() -> None:
    spec = {"x": {0: Dim("dimx", min=3, max=6), 1: Dim.AUTO}, "y": {0: Dim("dimy"), 1: Dim.AUTO}}
    message = _export_error(TwoInputs(), TWO, spec)
    fixed = apply_fixes(message, spec)
    assert to_json(fixed) == {
        "x": {"0": "dimy+1", "1": "auto"},
        "y": {"0": {"name": "dimy", "max": 5}, "1": "auto"},
    }
    ep = torch.export.export(TwoInputs(), TWO, dynamic_shapes=fixed)
    # dimy's bound is 5, so dimy+1 (x's dim) is bounded by 6; dim 1 stays unbounded
    uppers = sorted(str(r.upper) for r in ep.range_constraints.values())
    assert uppers == ["5", "6", "int_oo"]


def test_suggested_fixes_absent() -> None:
    assert suggested_fixes("Constraints violated (b)!\n  - something\n") == []
    with pytest.raises(ValueError):
        apply_fixes("no fixes here", {"x": {0: Dim("b")}})


def test_fix_to_json_forms() -> None:
    assert fix_to_json("b = 4").spec == 4
    assert fix_to_json("_b = Dim('_b', min=1, max=oo)").spec == {"name": "_b", "min": 1}
    assert fix_to_json("b = 2*_b").spec == "2*_b"
    assert fix_to_json("dx = 2*dy - 3").spec == "2*dy-3"
    assert fix_to_json("not a fix").model_dump() == {
        "text": "not a fix",
        "name": None,
        "spec": None,
    }


# --- widening examples of size 1 ------------------------------------------------------------


class _Pair(torch.nn.Module):
    def forward(self, x, y, z):
        return x, y, z


def test_size_one_dims_are_widened_with_derived_dims_and_values_kept() -> None:
    from engine.shapes.examples import widen_size_one_dims

    batch = Dim("batch", min=1, max=8)
    x, y, z = torch.randn(1, 3), torch.randn(2, 3), torch.randn(1, 1)
    spec = {"x": {0: batch}, "y": {0: batch + 1}, "z": {0: Dim.DYNAMIC, 1: Dim.AUTO}}
    widened = widen_size_one_dims(_Pair(), (x, y, z), {}, spec)
    assert widened is not None
    wx, wy, wz = widened.args
    assert wx.shape == (2, 3) and torch.equal(wx[0], x[0]) and torch.equal(wx[1], x[0])
    assert wy.shape == (3, 3) and torch.equal(wy[:2], y) and torch.equal(wy[2], y[0])
    assert wz is z  # hints are left alone
    assert widened.dims == [
        {"name": "batch", "positions": ["x.0", "y.0"], "example_size": 1, "traced_size": 2}
    ]
    spec["z"] = None  # torch refuses DYNAMIC at size 1
    ep = torch.export.export(_Pair(), widened.args, dynamic_shapes=spec)
    assert sorted(str(r) for r in ep.range_constraints.values()) == ["VR[1, 8]", "VR[2, 9]"]


def test_nothing_is_widened_at_other_sizes_or_where_the_range_stops_at_one() -> None:
    from engine.shapes.examples import widen_size_one_dims

    module, args = _Pair(), (torch.randn(2, 3), torch.randn(3, 3), torch.randn(1, 1))
    assert widen_size_one_dims(module, args, {}, {"x": {0: Dim("b", min=1, max=8)}}) is None
    args = (torch.randn(1, 3), *args[1:])
    assert widen_size_one_dims(module, args, {}, {"x": {0: Dim("b", min=0, max=1)}}) is None
    assert widen_size_one_dims(module, args, {}, None) is None


# --- suggested specs --------------------------------------------------------------------------


def _summary(path: str, name: str | None, shape: list[int] | None, dtype: str = "float32"):
    from schemas import InputSummary

    return InputSummary(path=path, name=name, type="Tensor", shape=shape, dtype=dtype)


def test_suggested_spec_shares_batch_and_seq_where_sizes_are_equal() -> None:
    from engine.shapes.examples import suggest_spec

    text = [
        _summary("kwargs['input_ids']", "input_ids", [1, 8], "int64"),
        _summary("kwargs['attention_mask']", "attention_mask", [1, 8], "int64"),
        _summary("kwargs['labels']", "labels", [1, 5], "int64"),
    ]
    assert suggest_spec(text) == {
        "input_ids": {"0": {"name": "batch", "min": 1}, "1": {"name": "seq", "min": 2}},
        "attention_mask": {"0": "batch", "1": "seq"},
        "labels": {"0": "batch", "1": {"name": "seq_2", "min": 2}},
    }


def test_no_batch_is_suggested_when_sizes_differ_or_only_vectors_are_given() -> None:
    from engine.shapes.examples import suggest_spec

    differ = [_summary("args[0]", "x", [4, 3]), _summary("args[1]", "y", [5, 3])]
    assert suggest_spec(differ) is None
    assert suggest_spec([_summary("args[0]", "v", [4])]) is None
    # a float matrix has no seq; an int matrix of width 1 neither; nested leaves are skipped
    inputs = [
        _summary("args[0]", "x", [2, 7]),
        _summary("args[1]", "ids", [2, 1], "int64"),
        _summary("args[2][0]", "pair", [3, 3]),
    ]
    assert suggest_spec(inputs) == {"x": {"0": {"name": "batch", "min": 1}}, "ids": {"0": "batch"}}
