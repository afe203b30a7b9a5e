"""The `calibration` upload (engine/quantization/calibration.py): its three formats, every
refusal with its code and reason, the check against the traced program, and int8
calibrated on it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from torch.export import Dim

from engine.errors import ExportError
from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export
from engine.quantization import calibration
from schemas import ExportOptions
from tests.engine.model_files import MODELS

EXAMPLE = ((torch.randn(2, 4),), {"mask": torch.ones(2, 4, dtype=torch.long)})


def samples(count: int, rows: int = 3) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    generator = torch.Generator().manual_seed(count)
    return [
        (
            (torch.randn(rows + i, 4, generator=generator),),
            {"mask": torch.randint(0, 2, (rows + i, 4), generator=generator)},
        )
        for i in range(count)
    ]


def write_safetensors(path: Path, found: list[Any]) -> Path:
    tensors = {}
    for n, (args, kwargs) in enumerate(found):
        tensors.update({f"{n}.args.{i}": t for i, t in enumerate(args)})
        tensors.update({f"{n}.kwargs.{k}": t for k, t in kwargs.items()})
    safetensors.torch.save_file(tensors, str(path))
    return path


def as_dict(sample: Any) -> dict[str, Any]:
    return {"args": sample[0], "kwargs": sample[1]}


def refusal(path: Path, example: Any = EXAMPLE, scheme: str = "int8") -> ExportError:
    with pytest.raises(ExportError) as caught:
        calibration.read(path, example, scheme)
    return caught.value


def same(a: list[Any], b: list[Any]) -> bool:
    flat_a, spec_a = torch.utils._pytree.tree_flatten(a)
    flat_b, spec_b = torch.utils._pytree.tree_flatten(b)
    return spec_a == spec_b and all(torch.equal(x, y) for x, y in zip(flat_a, flat_b, strict=True))


def test_safetensors_and_pt_files_read_back_the_same_samples(tmp_path: Path) -> None:
    expected = samples(3)
    from_safetensors = calibration.read(
        write_safetensors(tmp_path / "c.safetensors", expected), EXAMPLE, "int8"
    )
    torch.save([{"args": a, "kwargs": k} for a, k in expected], tmp_path / "c.pt")
    from_pt = calibration.read(tmp_path / "c.pt", EXAMPLE, "int8")
    assert len(from_safetensors) == len(from_pt) == 3
    assert same(from_safetensors, expected) and same(from_pt, expected)


def test_json_specs_without_a_seed_draw_different_samples(tmp_path: Path) -> None:
    spec = {"args": [{"shape": [2, 4]}], "kwargs": {"mask": {"shape": [2, 4], "dtype": "int64"}}}
    path = tmp_path / "c.json"
    path.write_text(json.dumps([spec, spec, {**spec, "seed": 0}]))
    found = calibration.read(path, EXAMPLE, "int8")
    assert len(found) == 3
    first, second, seeded = (sample[0][0] for sample in found)
    assert not torch.equal(first, second)
    assert torch.equal(first, seeded)  # sample 0 is drawn with seed 0


class Opaque:
    pass


@pytest.mark.parametrize(
    ("name", "write", "details"),
    [
        (
            "c.pt",
            lambda p: torch.save([((torch.ones(2, 4), Opaque()),)], p),
            {"format": "pt", "pickle_refused": True},
        ),
        ("c.pt", lambda p: torch.save({"args": ()}, p), {"format": "pt", "got": "dict"}),
        ("c.json", lambda p: p.write_text("[]"), {"samples": 0, "limit": 256}),
        ("c.json", lambda p: p.write_text(json.dumps([[1]] * 257)), {"samples": 257}),
        (
            "c.safetensors",
            lambda p: safetensors.torch.save_file({"0.input": torch.ones(1)}, str(p)),
            {"key": "0.input"},
        ),
        (
            "c.safetensors",
            lambda p: write_safetensors(p, [samples(1)[0], ((), {}), samples(1)[0]]),
            {"missing": ["1.*"]},
        ),
        (
            "c.safetensors",
            lambda p: safetensors.torch.save_file({"300.args.0": torch.ones(1)}, str(p)),
            {"samples": 301, "limit": 256},
        ),
        (
            "c.pt",
            lambda p: torch.save([as_dict(samples(1)[0]), (torch.ones(2, 4),)], p),
            {"sample": 1, "reason": "other_arguments", "kwargs": [], "expected_kwargs": ["mask"]},
        ),
        (
            "c.pt",
            lambda p: torch.save(
                [
                    {
                        "args": (torch.ones(2, 4).double(),),
                        "kwargs": {"mask": torch.ones(2, 4).long()},
                    }
                ],
                p,
            ),
            {"sample": 0, "reason": "other_tensor", "input": "[0][0]"},
        ),
        (
            "c.pt",
            lambda p: torch.save(
                [{"args": (torch.ones(4),), "kwargs": {"mask": torch.ones(2, 4).long()}}], p
            ),
            {"sample": 0, "reason": "other_tensor"},
        ),
    ],
)
def test_a_file_unlike_the_example_is_invalid_inputs_with_its_reason(
    tmp_path: Path, name: str, write: Any, details: dict[str, Any]
) -> None:
    path = tmp_path / name
    write(path)
    error = refusal(path)
    assert error.code == "invalid_inputs"
    assert error.stage == "loading"
    assert error.details["source"] == "calibration"
    assert {key: error.details.get(key) for key in details} == details


def test_a_non_tensor_input_must_equal_the_examples(tmp_path: Path) -> None:
    example = ((torch.ones(2, 4), 3), {})
    torch.save([(torch.zeros(2, 4), 3), (torch.zeros(2, 4), 4)], tmp_path / "c.pt")
    error = refusal(tmp_path / "c.pt", example)
    assert (error.details["sample"], error.details["reason"]) == (1, "other_constant")


def test_a_calibration_file_with_another_scheme_is_an_invalid_request(tmp_path: Path) -> None:
    path = write_safetensors(tmp_path / "c.safetensors", samples(2))
    error = refusal(path, scheme="int8_dynamic")
    assert error.code == "invalid_request"
    assert error.details == {
        "field": "calibration",
        "reason": "calibration_unused",
        "scheme": "int8_dynamic",
    }


class Masked(torch.nn.Module):
    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return x * mask


def test_samples_outside_the_programs_shapes_are_refused_before_calibrating() -> None:
    batch = Dim("batch", min=2, max=8)
    program = torch.export.export(
        Masked(), EXAMPLE[0], EXAMPLE[1], dynamic_shapes={"x": {0: batch}, "mask": {0: batch}}
    )
    calibration.check_ranges(program, samples(3), stage="converting")  # batches 3, 4, 5
    for rows, cols in ((9, 4), (3, 5)):
        bad = ((torch.randn(rows, 4 if cols == 4 else cols),), {"mask": torch.ones(rows, cols)})
        with pytest.raises(ExportError) as caught:
            calibration.check_ranges(program, [*samples(1), bad], stage="converting")
        error = caught.value
        assert (error.code, error.stage) == ("invalid_inputs", "converting")
        assert error.details["sample"] == 1 and error.details["reason"] == "outside_program"
        assert error.details["problem"]


def _int8_onnx(tmp_path: Path, calibration_file: Path | None) -> Any:
    options = {
        "targets": ["onnx"],
        "quantize": {"scheme": "int8"},
        "profile": {"enabled": False},
        "verify": {"roundtrip": False, "samples": 2},
    }
    out = tmp_path / (calibration_file.stem if calibration_file else "default")
    request = ExportRequest(
        upload=Upload(model=MODELS / "quant_cnn.py", calibration=calibration_file),
        options=ExportOptions.model_validate(options),
        out_dir=out,
        work_dir=out / "work",
    )
    return run_export(request).report


def test_int8_is_calibrated_on_the_uploaded_samples(tmp_path: Path) -> None:
    """Representative samples calibrate as well as the default ones; samples a hundred
    times too small give activation ranges the real inputs overflow: the full static int8
    then misses the budget and a fallback is used, so the upload is what int8 was
    calibrated on."""
    pytest.importorskip("onnxruntime")
    generator = torch.Generator().manual_seed(3)
    good = [((torch.randn(4, 3, 32, 32, generator=generator),), {}) for _ in range(6)]
    tiny = [((args[0] / 100,), {}) for args, _ in good]
    default = _int8_onnx(tmp_path, None)
    calibrated = _int8_onnx(tmp_path, write_safetensors(tmp_path / "good.safetensors", good))
    too_small = _int8_onnx(tmp_path, write_safetensors(tmp_path / "tiny.safetensors", tiny))
    assert default.quantization is not None and calibrated.quantization is not None
    assert too_small.quantization is not None
    assert (default.quantization.calibration_source, default.quantization.calibration_samples) == (
        "samples",
        3,  # the example and 2 verification samples
    )
    assert calibrated.quantization.calibration_source == "upload"
    assert calibrated.quantization.calibration_samples == 6
    good_entry = calibrated.quantization.targets["onnx"]
    bad_entry = too_small.quantization.targets["onnx"]
    assert good_entry.passed is True and good_entry.cosine is not None
    assert good_entry.cosine >= 0.99
    assert "missed the budget" not in (good_entry.method or "")  # the full static int8
    assert "missed the budget" not in (default.quantization.targets["onnx"].method or "")
    # Calibrated on the tiny samples, the full static int8 is worse: either it already
    # misses the budget where the job checks it (a fallback that needs no calibration is
    # used then, and the method says so), or the artifact is worse than the well
    # calibrated one on the verification samples and not called accurate. Which of the two
    # varies between machines with the same packages; the default samples never do either.
    fell_back = "the full int8 missed the budget" in (bad_entry.method or "")
    assert bad_entry.cosine is not None
    if not fell_back:
        assert bad_entry.cosine < good_entry.cosine and bad_entry.passed is False


def test_an_uploaded_sample_the_program_cannot_take_fails_the_job(tmp_path: Path) -> None:
    batch_of_nine = [((torch.randn(9, 3, 32, 32),), {})]  # quant_cnn's batch is 1 to 8
    path = write_safetensors(tmp_path / "nine.safetensors", batch_of_nine)
    report = _int8_onnx(tmp_path, path)
    assert report.status == "failed" and report.error is not None
    assert (report.error.code, report.error.stage) == ("invalid_inputs", "converting")
    assert report.error.details["reason"] == "outside_program"
    assert report.error.details["source"] == "calibration"
