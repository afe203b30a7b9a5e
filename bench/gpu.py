"""GPU checks and the CPU-vs-GPU export benchmark, in one command.

    python bench/gpu.py                 # checks + benchmark, 3 timed runs per model and device
    python bench/gpu.py --repeat 1 --json out/gpu.json

1. Checks: what torch sees (versions, devices, TF32 switches), then the `cuda`-marked tests
   (`pytest -m cuda tests/deploy/test_gpu.py` and any other `cuda` test), whose result is
   printed as pytest's summary line.
2. Benchmark: the engine (`engine.pipeline.export.run_export`, in this process, no sandbox) on a
   few models with `device: cpu` and `device: cuda`; per model and device the median of
   the export time (tracing + decomposing), the verification time and the total. For the
   GPU runs it also checks that the saved program's weights really are on the GPU.

Without CUDA it still runs end to end: the CPU column is measured and the GPU column says
why it is empty. Record its output in docs/gpu.md with the date and the device.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.load.model import Upload  # noqa: E402
from engine.pipeline.export import ExportRequest, run_export  # noqa: E402
from schemas import ExportOptions  # noqa: E402

# Inline models: big enough that the device matters for verification, small enough for CPU.
CONV_NET = """
import torch
from torch import nn


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layers = [nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64), nn.ReLU()]
        for _ in range(4):
            layers += [nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()]
        self.features = nn.Sequential(*layers)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        return self.head(self.features(x).mean(dim=(2, 3)))


model = ConvNet().eval()
example_args = (torch.randn(8, 3, 128, 128),)
"""

MLP = """
import torch
from torch import nn

model = nn.Sequential(
    nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024)
).eval()
example_args = (torch.randn(256, 1024),)
"""

MODELS: dict[str, str | Path] = {
    "tiny_transformer": ROOT / "examples" / "tiny_transformer.py",
    "conv_net": CONV_NET,
    "mlp_4k": MLP,
}


@dataclass
class Timing:
    """Median seconds of one model on one device (None where it did not run)."""

    model: str
    device: str
    export_s: float | None = None
    verify_s: float | None = None
    total_s: float | None = None
    status: str = "ok"
    weights_device: str | None = None


def describe_torch() -> dict[str, Any]:
    """What torch sees on this machine."""
    facts: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda_build": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        facts["devices"] = [
            {
                "name": torch.cuda.get_device_name(i),
                "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                "memory_gib": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1),
            }
            for i in range(torch.cuda.device_count())
        ]
        facts["cudnn"] = torch.backends.cudnn.version()
        facts["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
        facts["tf32_cudnn"] = torch.backends.cudnn.allow_tf32
    return facts


def run_cuda_tests() -> dict[str, Any]:
    """Run every `cuda`-marked test plus the no-GPU test; returns rc and pytest's summary."""
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "-m",
            "cuda or not cuda",
            str(ROOT / "tests" / "deploy" / "test_gpu.py"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in completed.stdout.splitlines() if line.strip()]
    return {"returncode": completed.returncode, "summary": lines[-1] if lines else ""}


def _model_path(name: str, source: str | Path, folder: Path) -> Path:
    if isinstance(source, Path):
        return source
    path = folder / f"{name}.py"
    path.write_text(source)
    return path


def _weights_device(program: Path) -> str:
    # Our own bench models: loading the program in this process is safe.
    loaded = torch.export.load(program)
    return ",".join(sorted({t.device.type for t in loaded.state_dict.values()})) or "none"


def time_model(name: str, model: Path, device: str, repeat: int, folder: Path) -> Timing:
    """Warm up once, then the median of `repeat` exports of `model` on `device`."""
    timing = Timing(model=name, device=device)
    if device == "cuda" and not torch.cuda.is_available():
        timing.status = "CUDA unavailable"
        return timing
    exports: list[float] = []
    verifies: list[float] = []
    totals: list[float] = []
    for attempt in range(repeat + 1):
        out = folder / f"{name}-{device}-{attempt}"
        options = ExportOptions.model_validate({"device": device})
        result = run_export(
            ExportRequest(
                upload=Upload(model=model), options=options, out_dir=out, work_dir=out / "work"
            )
        )
        if not result.succeeded:
            error = result.report.error
            timing.status = f"failed: {error.code if error else 'unknown'}"
            return timing
        if device == "cuda" and attempt == 0:
            torch.cuda.synchronize()
            timing.weights_device = _weights_device(out / "program.pt2")
        if attempt == 0:
            continue  # warm-up: first-use costs (CUDA context, kernels, caches)
        stages = {s.name: s.duration_s for s in result.report.stages}
        exports.append(stages.get("tracing", 0.0) + stages.get("decomposing", 0.0))
        verifies.append(stages.get("verifying", 0.0))
        totals.append(result.report.duration_s or 0.0)
    timing.export_s = statistics.median(exports)
    timing.verify_s = statistics.median(verifies)
    timing.total_s = statistics.median(totals)
    if device == "cuda" and timing.weights_device != "cuda":
        timing.status = f"ran, but weights on {timing.weights_device}"
    return timing


def _cell(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def format_table(timings: list[Timing]) -> str:
    """A Markdown table: one row per model, CPU and GPU side by side."""
    by_key = {(t.model, t.device): t for t in timings}
    rows = [
        "| model | CPU export s | CPU verify s | CPU total s "
        "| GPU export s | GPU verify s | GPU total s | GPU status |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for model in dict.fromkeys(t.model for t in timings):
        cpu, gpu = by_key[(model, "cpu")], by_key[(model, "cuda")]
        cpu_cells = [_cell(cpu.export_s), _cell(cpu.verify_s), _cell(cpu.total_s)]
        if cpu.status != "ok":
            cpu_cells = [cpu.status, "", ""]
        gpu_cells = [_cell(gpu.export_s), _cell(gpu.verify_s), _cell(gpu.total_s)]
        rows.append(f"| {model} | " + " | ".join([*cpu_cells, *gpu_cells, gpu.status]) + " |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    """Run the checks and the benchmark; exit 1 if a check or a CPU export failed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per model and device")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated subset")
    parser.add_argument("--skip-tests", action="store_true", help="benchmark only")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    # torch's own deprecation chatter (pytree internals) would bury the table.
    warnings.filterwarnings("ignore", category=FutureWarning)

    facts = describe_torch()
    print("## Machine")
    for key, value in facts.items():
        print(f"- {key}: {value}")
    if not facts["cuda_available"]:
        print("- CUDA is unavailable: the GPU column stays empty; the cuda tests skip.")

    tests: dict[str, Any] = {}
    if not args.skip_tests:
        tests = run_cuda_tests()
        print("\n## GPU checks (tests/deploy/test_gpu.py, cuda tests included)")
        print(f"- pytest: {tests['summary']} (exit {tests['returncode']})")

    timings: list[Timing] = []
    with tempfile.TemporaryDirectory(prefix="torchport-gpu-bench-") as tmp:
        folder = Path(tmp)
        for name in args.models.split(","):
            model = _model_path(name, MODELS[name], folder)
            for device in ("cpu", "cuda"):
                timings.append(time_model(name, model, device, args.repeat, folder))
                print(f"  {name} on {device}: {timings[-1].status}", file=sys.stderr)
    print(f"\n## Export benchmark (median of {args.repeat}, after one warm-up run)")
    print(format_table(timings))

    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {"machine": facts, "tests": tests, "timings": [asdict(t) for t in timings]},
                indent=2,
            )
        )
    failed = (tests and tests["returncode"] != 0) or any(
        t.status.startswith("failed") or t.status.startswith("ran, but") for t in timings
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
