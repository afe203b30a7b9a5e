"""Per-job cost of the sandbox: the same export sandboxed vs in an already-warm process.

    python bench/sandbox_overhead.py [--runs 7] [--json OUT]

overhead = median(sandboxed job, as the worker sees it) - median(the same
`engine.pipeline.run_export` in a warm process, with the round trip done
in-process). Both sides do the same work: load, trace, decompose, verify, save,
round trip. Also reported: RSS of the zygote and of the idle worker process.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

TINY = """
import torch
class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
    def forward(self, x):
        return torch.relu(self.linear(x))
model = Model()
example_args = (torch.randn(2, 8),)
"""

BLOCK = """
import torch
torch.manual_seed(0)
model = torch.nn.TransformerEncoderLayer(
    d_model=256, nhead=4, dim_feedforward=1024, batch_first=True, dropout=0.0
).eval()
example_args = (torch.randn(2, 32, 256),)
"""

MODELS = {"tiny (Linear 8→8)": TINY, "transformer block (d=256, 4 heads, ff=1024)": BLOCK}


def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="torchport-bench-"))
    os.chmod(root, 0o755)
    files = {}
    for index, (name, source) in enumerate(MODELS.items()):
        path = root / f"model{index}.py"
        path.write_text(source)
        files[name] = path

    from worker.sandbox import SandboxJob, SandboxRunner, SandboxSettings

    sandboxed: dict[str, list[float]] = {}
    with SandboxRunner(SandboxSettings(work_root=root / "work")) as runner:
        worker_rss = rss_mb()
        assert runner.zygote_pid is not None
        zygote_rss = rss_mb(runner.zygote_pid)
        layers: list[str] = []
        for name, path in files.items():
            times: list[float] = []
            for run in range(args.runs + 1):
                job_dir = root / f"sandboxed-{len(times)}-{run}-{path.stem}"
                started = time.perf_counter()
                result = runner.run(
                    SandboxJob(model=path, inputs=None, weights=None, options={}, job_dir=job_dir)
                )
                elapsed = time.perf_counter() - started
                assert result.report.status == "succeeded", result.error
                assert result.report.sandbox is not None
                layers = result.report.sandbox.layers
                if run:  # the first job warms the page cache for this model's files
                    times.append(elapsed)
            sandboxed[name] = times

    import torch  # noqa: F401  (only now: the worker side above never imported it)

    from engine import pipeline, roundtrip
    from engine.model import Upload
    from schemas import ExportOptions

    pipeline.warm_up(root / "warm")

    warm: dict[str, list[float]] = {}
    for name, path in files.items():
        times = []
        for run in range(args.runs + 1):
            out = root / f"warm-{run}-{path.stem}"
            started = time.perf_counter()
            exported = pipeline.run_export(
                pipeline.ExportRequest(
                    upload=Upload(model=path),
                    options=ExportOptions(),
                    out_dir=out / "out",
                    work_dir=out / "work",
                ),
                roundtrip_runner=roundtrip.run_in_process,
            )
            elapsed = time.perf_counter() - started
            assert exported.report.status == "succeeded", exported.report.error
            if run:
                times.append(elapsed)
        warm[name] = times

    rows = []
    for name in files:
        s, w = statistics.median(sandboxed[name]), statistics.median(warm[name])
        rows.append({"model": name, "sandboxed_s": s, "warm_s": w, "overhead_ms": (s - w) * 1000})
    print(f"layers: {', '.join(layers)}; runs per cell: {args.runs} (median)")
    print("| model | sandboxed job (s) | warm in-process (s) | overhead (ms) |")
    print("| --- | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['model']} | {row['sandboxed_s']:.3f} | {row['warm_s']:.3f} | "
            f"{row['overhead_ms']:.0f} |"
        )
    print(f"zygote RSS: {zygote_rss:.0f} MB; idle worker RSS (runner started): {worker_rss:.0f} MB")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "zygote_rss_mb": zygote_rss,
                    "worker_rss_mb": worker_rss,
                    "layers": layers,
                    "sandboxed": sandboxed,
                    "warm": warm,
                },
                indent=2,
            )
        )

    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
