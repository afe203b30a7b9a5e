"""Quantization: what each scheme saves in size and time, and costs in accuracy.

    python bench/quantize.py [--models quant_cnn.py] [--schemes int8,int8_dynamic]
        [--targets onnx,executorch] [--runs 20] [--json OUT]

For each model file (a path, or a name under tests/models/; the real-model suite's are
`bench/model_suite/hf_resnet.py` and so on) the whole pipeline (`engine.pipeline.export.run_export`,
in this process, no sandbox) runs once with `quantize: none` and once per scheme, with
the targets and `profile` on; per target and scheme it prints the artifact's size and
its p50 latency at the worker's threads (`report.profile`) as ratios of the float
artifact's, and the accuracy against float eager (`report.quantization`: the lowest
cosine, top-1 agreement, largest abs error). A scheme a target cannot take is shown as
refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.load.model import Upload  # noqa: E402
from engine.pipeline.export import ExportRequest, run_export  # noqa: E402
from schemas import ExportOptions, ReportDocument  # noqa: E402

MODELS = ROOT / "tests" / "models"


def model_path(model: str) -> Path:
    """`model` as given when that file exists (relative to here or the project), else
    under tests/models/."""
    for candidate in (Path(model), ROOT / model):
        if candidate.is_file():
            return candidate
    return MODELS / model


def export(model: str, scheme: str, targets: list[str], runs: int, tmp: Path) -> ReportDocument:
    """One export of `model` with `scheme`, its targets profiled."""
    options = ExportOptions.model_validate(
        {
            "targets": targets,
            "quantize": {"scheme": scheme},
            "profile": {"enabled": True, "runs": runs, "budget_s": 60},
            "verify": {"roundtrip": False},
        }
    )
    out = tmp / f"{Path(model).stem}-{scheme}"
    request = ExportRequest(
        upload=Upload(model=model_path(model)), options=options, out_dir=out, work_dir=out / "work"
    )
    return run_export(request).report


def p50(report: ReportDocument, name: str) -> float | None:
    """The p50 latency of artifact `name` at the worker's threads, in ms."""
    if report.profile is None:
        return None
    threads = report.profile.machine.threads
    for artifact in report.profile.artifacts:
        if artifact.name == name:
            for latency in artifact.latency:
                if latency.threads == threads:
                    return latency.p50_ms
    return None


def rows(
    model: str, scheme: str, base: ReportDocument, quantized: ReportDocument
) -> list[dict[str, Any]]:
    """One row per target: size and latency ratios to float, accuracy against float."""
    found = []
    for name, result in quantized.targets.items():
        float_result = base.targets.get(name)
        row: dict[str, Any] = {"model": model, "scheme": scheme, "target": name}
        if result.status != "succeeded" or float_result is None or not float_result.size:
            row["status"] = (
                result.error.details.get("reason", "failed") if result.error else "failed"
            )
            found.append(row)
            continue
        entry = quantized.quantization.targets.get(name) if quantized.quantization else None
        base_p50, quant_p50 = p50(base, name), p50(quantized, name)
        row.update(
            status="succeeded",
            float_size=float_result.size,
            size=result.size,
            size_ratio=float_result.size / (result.size or 1),
            float_p50_ms=base_p50,
            p50_ms=quant_p50,
            speedup=base_p50 / quant_p50 if base_p50 and quant_p50 else None,
            cosine=entry.cosine if entry else None,
            top1=entry.top1_agreement if entry else None,
            max_abs=entry.max_abs_error if entry else None,
            passed=entry.passed if entry else None,
        )
        found.append(row)
    return found


HEADER = (
    "model",
    "scheme",
    "target",
    "size (float, quantized)",
    "smaller",
    "p50 ms (float, quantized)",
    "faster",
    "cosine",
    "top-1",
    "max abs",
    "within budget",
)


def num(value: Any, fmt: str) -> str:
    """`value` formatted, or a dash."""
    return "-" if value is None else format(value, fmt)


def cells(row: dict[str, Any]) -> list[str]:
    """One row's cells."""
    head = [row["model"], row["scheme"], row["target"]]
    if row["status"] != "succeeded":
        return [*head, row["status"], *[""] * (len(HEADER) - 4)]
    return [
        *head,
        f"{row['float_size'] / 1024:.0f} KiB, {row['size'] / 1024:.0f} KiB",
        f"{row['size_ratio']:.2f}x",
        f"{num(row['float_p50_ms'], '.3f')}, {num(row['p50_ms'], '.3f')}",
        f"{num(row['speedup'], '.2f')}x",
        num(row["cosine"], ".4f"),
        num(row["top1"], ".0%"),
        num(row["max_abs"], ".2e"),
        str(row["passed"]),
    ]


def table(found: list[dict[str, Any]]) -> str:
    """The rows as a markdown table."""
    lines = ["| " + " | ".join(HEADER) + " |", "|" + " --- |" * len(HEADER)]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in found]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="quant_cnn.py")
    parser.add_argument("--schemes", default="int8,int8_dynamic")
    parser.add_argument("--targets", default="onnx,executorch")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    targets = args.targets.split(",")
    found: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            base = export(model, "none", targets, args.runs, Path(tmp))
            for scheme in args.schemes.split(","):
                quantized = export(model, scheme, targets, args.runs, Path(tmp))
                found += rows(Path(model).stem, scheme, base, quantized)
    print(table(found))
    if args.json:
        args.json.write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
