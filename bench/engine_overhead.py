"""Engine overhead: `engine.pipeline.export.run_export` vs calling torch directly.

Same process, same models, several sizes. The direct path is what a person writes by hand:
`torch.export.export` + `run_decompositions()` + `torch.export.save`. The engine path is a
whole `run_export` with verification off (it still loads the upload, runs the eager
reference, writes graph/signature/report JSON and hashes the artifacts). Verification's own
cost is measured separately, after the comparison. Direct and engine runs alternate, each
after a garbage collection, so drift and collector pauses hit both alike.

    python bench/engine_overhead.py [--repeats 7] [--markdown]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

from engine.load.model import Upload
from engine.pipeline.export import ExportRequest, run_export, warm_up
from schemas import ExportOptions

MODELS = {
    "mlp (4 layers, 256 wide)": """
        import torch
        from torch import nn
        model = nn.Sequential(*[m for _ in range(4) for m in (nn.Linear(256, 256), nn.ReLU())])
        example_args = (torch.randn(8, 256),)
    """,
    "transformer block (d=256, 8 heads)": """
        import torch
        from torch import nn
        model = nn.TransformerEncoderLayer(256, 8, 1024, batch_first=True).eval()
        example_args = (torch.randn(2, 64, 256),)
    """,
    "transformer (4 layers, d=512, dynamic batch)": """
        import torch
        from torch import nn
        from torch.export import Dim
        model = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True), 4
        ).eval()
        example_args = (torch.randn(2, 128, 512),)
        dynamic_shapes = {"src": {0: Dim("batch", min=1, max=32)}}
    """,
    "convnet (6 conv+bn blocks)": """
        import torch
        from torch import nn
        layers = []
        channels = 3
        for width in (32, 64, 64, 128, 128, 256):
            layers += [nn.Conv2d(channels, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU()]
            channels = width
        model = nn.Sequential(*layers).eval()
        example_args = (torch.randn(1, 3, 64, 64),)
    """,
}


def _direct(path: Path, out: Path) -> float:
    spec = importlib.util.spec_from_file_location(f"bench_{time.monotonic_ns()}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    started = time.perf_counter()
    ep = torch.export.export(
        module.model,
        module.example_args,
        dynamic_shapes=getattr(module, "dynamic_shapes", None),
        strict=False,
    )
    ep = ep.run_decompositions()
    torch.export.save(ep, out / "direct.pt2")
    return time.perf_counter() - started


def _engine(path: Path, work: Path, verify: bool) -> tuple[float, float]:
    options = ExportOptions.model_validate({"verify": {"enabled": verify}, "draft_report": False})
    request = ExportRequest(
        upload=Upload(model=path), options=options, out_dir=work / "out", work_dir=work / "work"
    )
    started = time.perf_counter()
    result = run_export(request)
    elapsed = time.perf_counter() - started
    assert result.succeeded, result.report.error
    verifying = sum(s.duration_s for s in result.report.stages if s.name == "verifying")
    roundtrip = result.report.verification.roundtrip if result.report.verification else None
    return elapsed, verifying + ((roundtrip.duration_s or 0.0) if roundtrip else 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        warm_up(tmp / "warm")
        rows = []
        for name, source in MODELS.items():
            path = tmp / f"{abs(hash(name))}.py"
            path.write_text(textwrap.dedent(source))
            _direct(path, tmp)
            _engine(path, tmp / "w0", verify=False)
            direct, engine, verify_cost = [], [], []
            for i in range(args.repeats):
                gc.collect()
                direct.append(_direct(path, tmp))
                gc.collect()
                engine.append(_engine(path, tmp / f"e{i}", verify=False)[0])
            for i in range(max(3, args.repeats // 2)):
                gc.collect()
                verify_cost.append(_engine(path, tmp / f"v{i}", verify=True)[1])
            d, e, v = (statistics.median(x) for x in (direct, engine, verify_cost))
            rows.append((name, d, e, e / d - 1, v))
            print(f"{name}: direct {d:.3f}s engine {e:.3f}s", file=sys.stderr)
    print(f"torch {torch.__version__}, {args.repeats} repeats, median seconds, 1 intra-op thread\n")
    print("| model | direct (s) | engine, verify off (s) | overhead | verification (s) |")
    print("| --- | --- | --- | --- | --- |")
    for name, d, e, overhead, v in rows:
        print(f"| {name} | {d:.3f} | {e:.3f} | {overhead:+.1%} | {v:.3f} |")


if __name__ == "__main__":
    main()
