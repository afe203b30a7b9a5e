"""Example inputs files: .safetensors, .pt (weights_only, pickle refused) and .json specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch

from engine.errors import InvalidInputs
from engine.load.inputs import build_inputs, normalize_inputs, read_inputs, summarize_inputs


class Payload:
    """Unpickling this creates `marker`: proof that a pickle payload ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (str(self.marker), "w"))


def write_json(path: Path, spec: object) -> Path:
    path.write_text(json.dumps(spec))
    return path


def refused(path: Path) -> InvalidInputs:
    with pytest.raises(InvalidInputs) as info:
        read_inputs(path)
    assert info.value.stage == "loading"
    assert info.value.code == "invalid_inputs"
    return info.value


# --- safetensors ---------------------------------------------------------------------


def test_safetensors_args_and_kwargs(tmp_path: Path) -> None:
    x, y, mask = torch.randn(2, 3), torch.arange(4), torch.ones(2, 3, dtype=torch.bool)
    path = tmp_path / "in.safetensors"
    safetensors.torch.save_file({"args.1": y, "args.0": x, "kwargs.mask": mask}, str(path))
    args, kwargs = read_inputs(path)
    assert len(args) == 2
    assert torch.equal(args[0], x)
    assert torch.equal(args[1], y)
    assert list(kwargs) == ["mask"]
    assert torch.equal(kwargs["mask"], mask)


def test_safetensors_bad_name(tmp_path: Path) -> None:
    path = tmp_path / "in.safetensors"
    safetensors.torch.save_file({"input0": torch.zeros(1)}, str(path))
    assert refused(path).details["key"] == "input0"


def test_safetensors_gap_in_positions(tmp_path: Path) -> None:
    path = tmp_path / "in.safetensors"
    safetensors.torch.save_file({"args.0": torch.zeros(1), "args.2": torch.zeros(1)}, str(path))
    assert refused(path).details["missing"] == ["args.1"]


def test_safetensors_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "in.safetensors"
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    details = refused(path).details
    assert details["format"] == "safetensors"
    assert details["exception"]


# --- .pt -----------------------------------------------------------------------------


def test_pt_dict(tmp_path: Path) -> None:
    x = torch.randn(2, 2)
    path = tmp_path / "in.pt"
    torch.save({"args": (x, 3), "kwargs": {"flag": True}}, path)
    args, kwargs = read_inputs(path)
    assert torch.equal(args[0], x)
    assert args[1] == 3
    assert kwargs == {"flag": True}


def test_pt_tuple_and_single_tensor(tmp_path: Path) -> None:
    x = torch.randn(2)
    torch.save((x, x + 1), tmp_path / "pair.pt")
    torch.save(x, tmp_path / "one.pt")
    args, kwargs = read_inputs(tmp_path / "pair.pt")
    assert len(args) == 2 and torch.equal(args[1], x + 1)
    assert kwargs == {}
    one, _ = read_inputs(tmp_path / "one.pt")
    assert len(one) == 1 and torch.equal(one[0], x)


def test_pt_unexpected_key(tmp_path: Path) -> None:
    path = tmp_path / "in.pt"
    torch.save({"args": (torch.zeros(1),), "extra": 1}, path)
    assert refused(path).details["unexpected"] == ["extra"]


def test_pt_kwargs_not_a_dict(tmp_path: Path) -> None:
    path = tmp_path / "in.pt"
    torch.save({"args": (torch.zeros(1),), "kwargs": [1, 2]}, path)
    details = refused(path).details
    assert details["key"] == "kwargs"
    assert details["got"] == "list"


def test_pt_pickle_payload_refused_without_running(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "in.pt"
    torch.save({"args": (Payload(marker),)}, path)
    assert not marker.exists()
    details = refused(path).details
    assert details["pickle_refused"] is True
    assert details["format"] == "pt"
    assert not marker.exists()


def test_pt_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "in.pt"
    path.write_bytes(b"PK\x03\x04 definitely not a zip")
    details = refused(path).details
    assert details["format"] == "pt"
    assert details["exception"]


# --- .json ---------------------------------------------------------------------------


def test_json_contract_example(tmp_path: Path) -> None:
    spec = {
        "args": [{"shape": [2, 3], "dtype": "float32", "fill": "randn"}, 4],
        "kwargs": {"mask": {"shape": [2, 3], "dtype": "bool", "fill": "ones"}},
        "seed": 0,
    }
    args, kwargs = read_inputs(write_json(tmp_path / "in.json", spec))
    assert args[0].shape == (2, 3) and args[0].dtype == torch.float32
    assert args[1] == 4
    assert kwargs["mask"].dtype == torch.bool and bool(kwargs["mask"].all())


def test_json_seed_is_deterministic() -> None:
    spec = {"args": [{"shape": [8], "dtype": "float32"}]}
    first, _ = build_inputs({**spec, "seed": 1})
    again, _ = build_inputs({**spec, "seed": 1})
    other, _ = build_inputs({**spec, "seed": 2})
    assert torch.equal(first[0], again[0])
    assert not torch.equal(first[0], other[0])


def test_json_fills() -> None:
    args, _ = build_inputs(
        {
            "args": [
                {"shape": [2, 2], "dtype": "int64", "fill": "zeros"},
                {"shape": [3], "dtype": "float16", "fill": "ones"},
                {"shape": [2, 3], "dtype": "int32", "fill": "arange"},
                {"shape": [200], "dtype": "int64", "fill": "randint(-3, 4)"},
                {"shape": [100], "dtype": "float64", "fill": "rand"},
                {"shape": [5], "dtype": "torch.bfloat16", "fill": "randn"},
                {"shape": [], "dtype": "int64"},
            ]
        }
    )
    zeros, ones, arange, ints, uniform, half, scalar = args
    assert torch.equal(zeros, torch.zeros(2, 2, dtype=torch.int64))
    assert torch.equal(ones, torch.ones(3, dtype=torch.float16))
    assert arange.tolist() == [[0, 1, 2], [3, 4, 5]] and arange.dtype == torch.int32
    assert int(ints.min()) >= -3 and int(ints.max()) <= 3
    assert int(ints.min()) < 0 < int(ints.max())
    assert uniform.dtype == torch.float64 and 0 <= float(uniform.min()) <= float(uniform.max()) < 1
    assert half.dtype == torch.bfloat16
    assert scalar.shape == () and scalar.dtype == torch.int64


def test_json_plain_values_pass_through() -> None:
    args, kwargs = build_inputs(
        {"args": [1.5, "mode", [1, [2, 3]], None], "kwargs": {"cfg": {"depth": 2, "n": [1]}}}
    )
    assert args == (1.5, "mode", [1, [2, 3]], None)
    assert kwargs == {"cfg": {"depth": 2, "n": [1]}}


def test_json_nested_tensor_specs() -> None:
    args, _ = build_inputs({"args": [[{"shape": [1]}, {"pair": {"shape": [2], "fill": "ones"}}]]})
    (nested,) = args
    assert nested[0].shape == (1,) and nested[0].dtype == torch.float32
    assert torch.equal(nested[1]["pair"], torch.ones(2))


def test_json_bare_list_means_args() -> None:
    args, kwargs = build_inputs([{"shape": [2], "fill": "zeros"}, 3])
    assert torch.equal(args[0], torch.zeros(2)) and args[1] == 3
    assert kwargs == {}


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"args": [{"shape": [2], "dtype": "float99"}]}, "args.0.dtype"),
        ({"args": [{"shape": [2], "fill": "gaussian"}]}, "args.0.fill"),
        ({"args": [{"shape": [2], "dtype": "int64", "fill": "randn"}]}, "args.0.fill"),
        ({"args": [{"shape": [2], "fill": "randint(5, 5)"}]}, "args.0.fill"),
        ({"args": [{"shape": [2, -1]}]}, "args.0.shape"),
        ({"args": [{"shape": "2x3"}]}, "args.0.shape"),
        ({"kwargs": {"m": [0, {"shape": [1], "dtype": 7}]}}, "kwargs.m.1.dtype"),
        ({"args": {"x": 1}}, "args"),
        ({"kwargs": [1]}, "kwargs"),
        ({"args": [], "seed": "zero"}, "seed"),
    ],
)
def test_json_spec_errors_name_the_path(tmp_path: Path, spec: object, path: str) -> None:
    details = refused(write_json(tmp_path / "in.json", spec)).details
    assert details["format"] == "json"
    assert details["path"] == path


def test_json_unknown_top_level_key(tmp_path: Path) -> None:
    details = refused(write_json(tmp_path / "in.json", {"args": [], "inputs": []})).details
    assert details["unexpected"] == ["inputs"]


def test_json_invalid(tmp_path: Path) -> None:
    path = tmp_path / "in.json"
    path.write_text('{"args": [1,\n  oops]}')
    details = refused(path).details
    assert details["exception"] == "JSONDecodeError"
    assert details["line"] == 2


# --- format detection and normalization ----------------------------------------------


def test_format_sniffed_without_suffix(tmp_path: Path) -> None:
    write_json(tmp_path / "inputs", {"args": [{"shape": [3], "fill": "zeros"}]})
    torch.save((torch.ones(1),), tmp_path / "upload")
    args, _ = read_inputs(tmp_path / "inputs")
    assert torch.equal(args[0], torch.zeros(3))
    pt_args, _ = read_inputs(tmp_path / "upload")
    assert torch.equal(pt_args[0], torch.ones(1))


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "inputs.npy"
    path.write_bytes(b"\x93NUMPY\x01\x00")
    assert refused(path).details["file"] == "inputs.npy"


def test_normalize_inputs() -> None:
    x = torch.zeros(1)
    assert normalize_inputs(x, None, source="module") == ((x,), {})
    args, kwargs = normalize_inputs([x, 2], {"k": 1}, source="module")
    assert args == (x, 2) and kwargs == {"k": 1}
    with pytest.raises(InvalidInputs) as info:
        normalize_inputs({"x": x}, None, source="module")
    assert info.value.details == {"source": "module", "key": "args", "got": "dict"}


def test_summaries_name_var_keywords_by_key_and_leave_var_positionals_unnamed() -> None:
    def forward(x, *rest, flag=False, **extra):
        return x

    tensor = torch.zeros(4, 1)
    summaries = summarize_inputs(
        forward, (tensor, tensor, 1.5), {"flag": True, "bias": torch.ones(2), "note": "hi"}
    )
    assert [(s.path, s.name, s.type, s.shape, s.value) for s in summaries] == [
        ("args[0]", "x", "Tensor", [4, 1], None),
        ("args[1]", None, "Tensor", [4, 1], None),
        ("args[2]", None, "float", None, 1.5),
        ("kwargs['flag']", "flag", "bool", None, True),
        ("kwargs['bias']", "bias", "Tensor", [2], None),
        ("kwargs['note']", "note", "str", None, "hi"),
    ]


def test_summaries_of_inputs_that_do_not_bind_carry_no_names() -> None:
    def forward(x):
        return x

    summaries = summarize_inputs(forward, (torch.zeros(1), torch.zeros(2)), {})
    assert [(s.path, s.name, s.shape) for s in summaries] == [
        ("args[0]", None, [1]),
        ("args[1]", None, [2]),
    ]
    assert summarize_inputs(forward, (), {"y": float("nan")})[0].value == "nan"
