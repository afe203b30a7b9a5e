"""torch's deserializer with the schema's type hints kept per class
(engine.serialize.serde_hints)."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest
import torch
from torch._export.serde import schema, serialize

from engine.serialize import serde_hints

REAL_GET_TYPE_HINTS = typing.get_type_hints


@pytest.fixture
def program(tmp_path: Path) -> tuple[Path, tuple[torch.Tensor, ...]]:
    """A decomposed transformer layer with a dynamic batch, saved."""
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(
        d_model=16, nhead=2, dim_feedforward=32, batch_first=True, dropout=0.0
    ).eval()
    args = (torch.randn(3, 5, 16),)
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(model, args, dynamic_shapes=({0: batch},)).run_decompositions()
    path = tmp_path / "program.pt2"
    torch.export.save(ep, path)
    return path, args


def test_a_program_loads_the_same_with_the_cached_hints(
    program: tuple[Path, tuple[torch.Tensor, ...]], monkeypatch: pytest.MonkeyPatch
) -> None:
    path, args = program
    monkeypatch.setattr(serialize, "typing", typing)  # torch's own deserializer
    assert not serde_hints.installed()
    plain = torch.export.load(path)

    assert serde_hints.install() is True
    assert serde_hints.installed()
    assert serde_hints.install() is True  # idempotent
    cached = torch.export.load(path)
    again = torch.export.load(path)  # from the cache this time

    for loaded in (cached, again):
        assert str(loaded.graph) == str(plain.graph)
        assert loaded.graph_signature == plain.graph_signature
        assert {str(k): str(v) for k, v in loaded.range_constraints.items()} == {
            str(k): str(v) for k, v in plain.range_constraints.items()
        }
        bigger = (torch.randn(7, 5, 16),)
        for inputs in (args, bigger):
            assert torch.equal(loaded.module()(*inputs), plain.module()(*inputs))


def test_each_schema_class_gets_the_hints_torch_computes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serialize, "typing", typing)
    assert serde_hints.install()
    shim = serialize.typing
    names = vars(schema)
    classes = [c for c in names.values() if isinstance(c, type) and dataclasses.is_dataclass(c)]
    assert len(classes) > 20
    for cls in classes:
        expected = REAL_GET_TYPE_HINTS(cls, globalns=names)
        assert shim.get_type_hints(cls, globalns=names) == expected
        first = shim.get_type_hints(cls, globalns=names)
        first["poisoned"] = int  # the caller's copy: the cache keeps its own
        assert shim.get_type_hints(cls, globalns=names) == expected


def test_only_the_deserializer_sees_the_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serialize, "typing", typing)
    assert serde_hints.install()
    assert typing.get_type_hints is REAL_GET_TYPE_HINTS  # everyone else: the real one
    shim = serialize.typing
    assert shim.get_origin is typing.get_origin  # the rest of typing, unchanged

    class Local:
        value: int

    # Anything but a schema class in the schema's namespace goes to the real function.
    assert shim.get_type_hints(Local) == {"value": int}
    assert shim.get_type_hints(Local, globalns={}, localns={"x": 1}) == {"value": int}


def test_an_unexpected_deserializer_keeps_its_typing(monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in = object()
    monkeypatch.setattr(serialize, "typing", stand_in)
    assert serde_hints.install() is False
    assert serialize.typing is stand_in
