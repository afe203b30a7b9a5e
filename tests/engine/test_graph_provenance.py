"""graph.json's provenance of library nodes: the deepest library frame of a node that has
no frame in the upload, and the op a decomposed node came from."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.decompose.decomposition import decompose
from engine.diagnostics.source_map import SourceMap
from engine.serialize.documents import graph_document
from schemas import DecompositionOptions, GraphDocument, GraphNode
from tests.engine import library_blocks

MODELS = Path(__file__).parent.parent / "models"
LIBRARY = Path(library_blocks.__file__)


def _line(marker: str) -> int:
    lines = LIBRARY.read_text().splitlines()
    return next(i for i, text in enumerate(lines, 1) if f"# {marker}" in text)


@pytest.fixture(scope="module")
def library_graph() -> GraphDocument:
    ep = torch.export.export(library_blocks.Block(), (torch.randn(2, 3, 8),))
    ep = decompose(ep, DecompositionOptions()).ep
    return graph_document(ep, SourceMap(MODELS))  # the upload: not this file


def _calls(doc: GraphDocument) -> list[GraphNode]:
    return [n for n in doc.graph.nodes if n.op == "call_function"]


def test_library_nodes_name_the_deepest_frame_outside_torch(library_graph: GraphDocument) -> None:
    calls = _calls(library_graph)
    assert calls and all(n.source is None for n in calls)
    by_target = {n.target: n.library_source for n in calls}
    addmm, gelu = by_target["aten.addmm.default"], by_target["aten.gelu.default"]
    assert addmm is not None and gelu is not None
    # Not torch/nn/modules/linear.py, where F.linear is called: the library's own line.
    assert (addmm.file, addmm.line) == ("tests/engine/library_blocks.py", _line("PROJECTION"))
    assert addmm.code == "hidden = self.proj(x)  # PROJECTION"
    assert (gelu.file, gelu.line) == ("tests/engine/library_blocks.py", _line("ACTIVATION"))
    assert not any(n.library_source for n in library_graph.graph.nodes if n.op == "placeholder")


def test_a_node_of_the_upload_has_no_library_source() -> None:
    ep = torch.export.export(library_blocks.Block(), (torch.randn(2, 8),))
    doc = graph_document(ep, SourceMap(LIBRARY.parent))  # now the library file is the upload
    calls = _calls(doc)
    assert calls and all(n.source is not None for n in calls)
    assert all(n.library_source is None for n in calls)
    assert {n.source.file for n in calls if n.source} == {"library_blocks.py"}


def test_decomposed_nodes_name_the_op_they_came_from(library_graph: GraphDocument) -> None:
    origins = {n.target: n.decomposed_from for n in _calls(library_graph)}
    # linear on a 3-d input becomes view → permute → addmm → view
    assert origins["aten.addmm.default"] == "aten.linear.default"
    assert origins["aten.permute.default"] == "aten.linear.default"
    assert origins["aten.gelu.default"] is None  # core ATen: kept as it was traced


def test_without_decomposition_nothing_came_from_another_op() -> None:
    ep = torch.export.export(library_blocks.Block(), (torch.randn(2, 8),))
    doc = graph_document(ep, SourceMap(MODELS))
    assert [n.decomposed_from for n in _calls(doc)] == [None] * len(_calls(doc))
    assert "aten.linear.default" in {n.target for n in _calls(doc)}
