"""The save → load → run check in a fresh torch-only process, compared bit for bit."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.diagnostics.source_map import SourceMap
from engine.serialize import roundtrip
from tests.engine.model_files import import_model_file as fixture


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> dict[str, Any]:
        y = self.linear(x) * scale
        return {"y": y, "parts": (y.argmax(-1), -torch.zeros(2))}


def saved(
    tmp_path: Path,
    model: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
) -> tuple[Path, Path, Any]:
    kwargs = kwargs or {}
    ep = torch.export.export(model, args, kwargs)
    pt2, payload = tmp_path / "program.pt2", tmp_path / "payload.pt"
    torch.export.save(ep, pt2)
    with torch.no_grad():
        expected = ep.module()(*args, **kwargs)
    roundtrip.write_payload(payload, args, kwargs, expected)
    return pt2, payload, expected


@pytest.fixture
def affine(tmp_path: Path) -> tuple[Path, Path, Any]:
    torch.manual_seed(0)
    return saved(tmp_path, Affine(), (torch.randn(4, 3),), {"scale": torch.tensor(2.0)})


def test_a_plain_model_roundtrips_bit_for_bit_in_a_fresh_process(
    affine: tuple[Path, Path, Any],
) -> None:
    pt2, payload, _ = affine
    check = roundtrip.run_in_subprocess(pt2, payload)
    assert check.status == "passed"
    assert check.bitwise_equal is True
    assert check.loader == "subprocess"
    assert check.duration_s is not None and check.duration_s > 0
    assert [(o.path, o.shape, o.dtype, o.passed) for o in check.outputs] == [
        ("['y']", [4, 2], "float32", True),
        ("['parts'][0]", [4], "int64", True),
        ("['parts'][1]", [2], "float32", True),
    ]
    assert all(o.max_abs_error == 0.0 for o in check.outputs)


def test_the_payload_loads_with_weights_only(affine: tuple[Path, Path, Any]) -> None:
    _, payload, _ = affine
    data = torch.load(payload, weights_only=True)
    assert data["expected_paths"] == ["['y']", "['parts'][0]", "['parts'][1]"]
    assert [tuple(t.shape) for t in data["inputs"]] == [(4, 3), ()]


def test_a_tampered_expected_output_is_not_bitwise_equal(
    affine: tuple[Path, Path, Any],
) -> None:
    pt2, payload, _ = affine
    data = torch.load(payload, weights_only=True)
    data["expected"][0] = data["expected"][0] + 0.25
    torch.save(data, payload)
    result = roundtrip.check_saved(pt2, payload)
    assert result["status"] == "failed"
    assert result["bitwise_equal"] is False
    first, second, third = result["outputs"]
    assert first["passed"] is False
    assert first["max_abs_error"] == pytest.approx(0.25)
    assert second["passed"] is True and third["passed"] is True


def test_negative_zero_is_not_bitwise_equal_to_zero(affine: tuple[Path, Path, Any]) -> None:
    pt2, payload, expected = affine
    assert bool(expected["parts"][1].signbit().all())  # the model returns -0.0
    data = torch.load(payload, weights_only=True)
    data["expected"][2] = torch.zeros(2)
    torch.save(data, payload)
    result = roundtrip.check_saved(pt2, payload)
    assert result["bitwise_equal"] is False
    assert [o["passed"] for o in result["outputs"]] == [True, True, False]


class NaNs(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


def test_nan_at_the_same_positions_is_equal(tmp_path: Path) -> None:
    pt2, payload, expected = saved(tmp_path, NaNs(), (torch.tensor([1.0, -1.0, 2.0]),))
    assert int(expected.isnan().sum()) == 1
    result = roundtrip.check_saved(pt2, payload)
    assert result["status"] == "passed"
    assert result["bitwise_equal"] is True

    data = torch.load(payload, weights_only=True)
    data["expected"][0] = torch.tensor([float("nan"), float("nan"), 2.0]).log()
    torch.save(data, payload)
    assert roundtrip.check_saved(pt2, payload)["bitwise_equal"] is False


def test_a_type_registered_in_user_code_fails_to_load_in_a_fresh_process(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Saving works (the type has a serialized name); a torch-only loader cannot rebuild it."""
    hf = fixture("verify_hf_output")
    pt2, payload, _ = saved(tmp_path, hf.model, hf.example_args)

    # torch 2.13 logs the weights_only fallback for the namedtuple example input with a
    # broken format string; pytest's log capture would raise on it.
    caplog.set_level(logging.ERROR, logger="torch._export.serde.serialize")
    here = roundtrip.check_saved(pt2, payload)  # this process imported the fixture
    assert here["status"] == "passed"

    check = roundtrip.run_in_subprocess(pt2, payload)
    assert check.status == "failed"
    assert check.bitwise_equal is None
    assert check.reason is not None
    assert check.reason.startswith("load failed: ModuleNotFoundError")
    assert "verify_hf_output" in check.reason


def test_an_unreadable_program_is_reported_not_raised(
    affine: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    _, payload, _ = affine
    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"not a zip file")
    result = roundtrip.check_saved(broken, payload)
    assert result["status"] == "failed"
    assert result["reason"].startswith("load failed: ")


def test_the_module_entry_point_writes_the_json(
    affine: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    pt2, payload, _ = affine
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-m",
            "engine.serialize.roundtrip",
            str(pt2),
            str(payload),
            str(out),
        ],
        cwd=tmp_path,
        capture_output=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["status"] == "passed"
    assert result["bitwise_equal"] is True
    assert roundtrip.main([]) == 2


def test_the_loading_process_imports_only_torch(
    affine: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    pt2, payload, _ = affine
    code = (
        "import json, sys\n"
        "from engine.serialize.roundtrip import check_saved\n"
        "check_saved(sys.argv[1], sys.argv[2])\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code, str(pt2), str(payload)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    loaded = set(json.loads(proc.stdout.splitlines()[-1]))
    assert "torch" in loaded
    assert not loaded & {"schemas", "pydantic", "service", "worker", "verify_hf_output"}


def test_a_hung_loader_is_stopped(affine: tuple[Path, Path, Any]) -> None:
    pt2, payload, _ = affine
    check = roundtrip.run_in_subprocess(pt2, payload, timeout_s=0.01)
    assert check.status == "failed"
    assert check.bitwise_equal is None


def test_loading_first_and_running_later_is_the_same_check(
    affine: tuple[Path, Path, Any], tmp_path: Path
) -> None:
    pt2, payload, _ = affine
    loaded = roundtrip.load_saved(pt2)  # before the payload exists, in the sandbox
    assert loaded.failure is None
    split = roundtrip.run_loaded(loaded, payload)
    whole = roundtrip.check_saved(pt2, payload)
    for result in (split, whole):
        result.pop("duration_s")
    assert split == whole
    assert split["status"] == "passed"

    broken = tmp_path / "broken.pt2"
    broken.write_bytes(b"not a zip")
    failed = roundtrip.run_loaded(roundtrip.load_saved(broken), payload)
    assert failed["status"] == "failed"
    assert failed["reason"].startswith("load failed:")
    missing = roundtrip.run_loaded(roundtrip.load_saved(pt2), tmp_path / "no-payload.pt")
    assert missing["reason"].startswith("payload unreadable:")


def test_the_pipeline_announces_the_saved_program_before_the_round_trip(tmp_path: Path) -> None:
    from engine.load.model import Upload
    from engine.pipeline import export as pipeline
    from schemas import ExportOptions

    model = tmp_path / "model.py"
    model.write_text(
        "import torch\nmodel = torch.nn.Linear(2, 2)\nexample_args = (torch.ones(1, 2),)\n"
    )
    events: list[tuple[str, bool]] = []

    def prefetch(program: Path) -> None:
        events.append(("prefetch", program.is_file()))

    def runner(program: Path, payload: Path) -> Any:
        events.append(("run", payload.is_file()))
        return roundtrip.run_in_process(program, payload)

    def export(options: ExportOptions, name: str) -> Any:
        request = pipeline.ExportRequest(
            Upload(model), options, tmp_path / name / "out", tmp_path / name / "work"
        )
        return pipeline.run_export(request, roundtrip_runner=runner, roundtrip_prefetch=prefetch)

    result = export(ExportOptions(), "with")
    assert result.report.status == "succeeded"
    assert events == [("prefetch", True), ("run", True)]
    events.clear()
    off = ExportOptions.model_validate({"verify": {"roundtrip": False}})
    assert export(off, "without").report.status == "succeeded"
    assert events == []


def _stage_spy() -> tuple[list[tuple[str, ...]], dict[str, Any]]:
    """Round-trip callbacks that record what they were told, in which stage, and
    whether the program was on disk then; the runner runs the round trip in-process."""
    events: list[tuple[str, ...]] = []
    stage = {"now": ""}

    def progress(event: Any) -> None:
        stage["now"] = event.stage

    def prefetch(program: Path) -> None:
        events.append(("prefetch", stage["now"], str(program.is_file())))

    def drop() -> None:
        events.append(("drop", stage["now"]))

    def runner(program: Path, payload: Path) -> Any:
        events.append(("run", stage["now"], str(program.is_file())))
        return roundtrip.run_in_process(program, payload)

    callbacks = {
        "progress": progress,
        "roundtrip_runner": runner,
        "roundtrip_prefetch": prefetch,
        "roundtrip_drop": drop,
    }
    return events, callbacks


def test_with_a_droppable_loader_the_program_is_saved_before_verification(
    tmp_path: Path,
) -> None:
    """The loader loads the program while verification runs (engine.serialize.program_save); the
    stages keep their order and the round trip checks the program saved then."""
    from tests.engine.model_files import export_file

    events, callbacks = _stage_spy()
    result = export_file(tmp_path, "docs_conv_batchnorm.py", **callbacks)
    assert result.succeeded, result.report.error
    assert events == [("prefetch", "verifying", "True"), ("run", "serializing", "True")]
    assert [s.name for s in result.report.stages] == [
        "loading",
        "tracing",
        "decomposing",
        "verifying",
        "serializing",
    ]
    verification = result.report.verification
    assert verification is not None and verification.roundtrip is not None
    assert verification.roundtrip.status == "passed"
    assert verification.roundtrip.save_s is not None and verification.roundtrip.save_s > 0
    assert result.artifacts["program.pt2"] == tmp_path / "out" / "program.pt2"


def test_a_program_changed_by_verification_is_dropped_and_saved_again(tmp_path: Path) -> None:
    """Diffusers' VAE decoder fails verification once decomposed (group_norm's
    decomposition raises on it), and the pipeline keeps group_norm to recover: the program
    saved before verification is not the one delivered, so its loader is dropped, and the
    recovered program is saved, loaded and checked in the serializing stage."""
    pytest.importorskip("diffusers")
    from tests.engine.model_files import export_file

    events, callbacks = _stage_spy()
    result = export_file(tmp_path, "hf_vae.py", **callbacks)
    assert result.succeeded, result.report.error
    decomposition = result.report.decomposition
    assert decomposition is not None
    assert decomposition.kept_after_failure == ["aten.group_norm.default"]
    assert events == [
        ("prefetch", "verifying", "True"),
        ("drop", "verifying"),
        ("prefetch", "serializing", "True"),
        ("run", "serializing", "True"),
    ]
    verification = result.report.verification
    assert verification is not None and verification.roundtrip is not None
    assert verification.roundtrip.status == "passed"
    assert verification.roundtrip.save_s is not None and verification.roundtrip.save_s > 0
    saved = torch.export.load(tmp_path / "out" / "program.pt2")
    kept = {str(n.target) for n in saved.graph.nodes if n.op == "call_function"}
    assert "aten.group_norm.default" in kept


def test_an_early_save_that_fails_leaves_nothing_and_announces_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed early save is not reported where it happened: the file is gone, no
    loader was told of it, and the serializing stage saves (and fails) again."""
    from engine.serialize.program_save import EarlySave

    ep = torch.export.export(torch.nn.Linear(2, 2), (torch.ones(1, 2),))
    path = tmp_path / "program.pt2"

    def broken_save(program: Any, target: Any) -> None:
        Path(target).write_bytes(b"half a zip")
        raise RuntimeError("disk gone")

    told: list[object] = []
    monkeypatch.setattr(torch.export, "save", broken_save)
    early = EarlySave.begin(
        ep, path, SourceMap(tmp_path), prefetch=told.append, drop=lambda: told.append("drop")
    )
    assert (early.saved, early.save_s, path.exists(), told) == (False, None, False, [])
    early.discard()  # nothing was announced: nothing to drop
    assert told == []

    monkeypatch.undo()
    early = EarlySave.begin(
        ep, path, SourceMap(tmp_path), prefetch=told.append, drop=lambda: told.append("drop")
    )
    assert early.saved and early.save_s is not None and told == [path]
    early.discard()
    assert told == [path, "drop"] and not path.exists() and not early.saved
