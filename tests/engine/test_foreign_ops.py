"""Operators a torch-only loader cannot resolve are named before the program is saved."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.diagnostics.source_map import SourceMap
from engine.serialize.foreign_ops import TORCH_NAMESPACES, foreign_ops
from tests.engine.model_files import MODELS, import_model_file
from tests.engine.model_files import export_file as export


def test_torch_namespaces_are_those_of_a_bare_import() -> None:
    script = (
        "import torch; print(sorted({n.split('::')[0] "
        "for n in torch._C._dispatch_get_all_op_names()}))"
    )
    printed = subprocess.run(
        [sys.executable, "-I", "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert set(ast.literal_eval(printed)) == TORCH_NAMESPACES


@pytest.mark.parametrize("early", [False, True], ids=["saved-late", "saved-early"])
def test_an_uploads_own_operator_fails_before_the_save(tmp_path: Path, early: bool) -> None:
    prefetched: list[Path] = []
    # with a loader that can be dropped, the program is saved before verification
    # (engine.serialize.program_save.EarlySave); the refusal still comes after it, at the same stage
    callbacks = {"roundtrip_prefetch": prefetched.append, "roundtrip_drop": lambda: None}
    result = export(tmp_path, "portable_library_op.py", **(callbacks if early else {}))
    assert prefetched == []
    error = result.report.error
    assert error is not None and error.code == "non_portable_op"
    assert error.stage == "serializing"
    assert error.details["ops"] == [
        {
            "op": "tp_portable.scale.default",
            "namespace": "tp_portable",
            "library": "upload",
            "count": 1,
        }
    ]
    assert error.details["libraries"] == ["upload"]
    assert error.location is not None
    assert (error.location.file, error.location.line) == ("portable_library_op.py", 7)
    assert error.hint is not None and "tp_portable.scale.default" in error.hint
    assert not (tmp_path / "out" / "program.pt2").exists()
    assert result.report.verification is not None and result.report.verification.passed


def test_without_portability_and_round_trip_the_operator_is_kept(tmp_path: Path) -> None:
    result = export(
        tmp_path, "portable_library_op.py", {"portable": False, "verify": {"roundtrip": False}}
    )
    assert result.succeeded, result.report.error
    assert (tmp_path / "out" / "program.pt2").exists()


def test_transformers_grouped_mm_fallback_is_named_with_its_library() -> None:
    pytest.importorskip("transformers")
    upload = import_model_file("hf_qwen3_moe")
    ep = torch.export.export(upload.model, (), dict(upload.example_kwargs), strict=False)
    (found,) = foreign_ops(ep, SourceMap(MODELS))
    assert (found.op, found.namespace, found.library, found.location) == (
        "transformers.grouped_mm_fallback.default",
        "transformers",
        "transformers",
        None,
    )
    assert found.count == 2 * upload.config.num_hidden_layers  # up and down projections
