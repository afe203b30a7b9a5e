"""Per-job cost of the sandbox: the same export sandboxed vs in an already-warm process.

    python bench/sandbox_overhead.py [--runs 9] [--json OUT] [--no-baseline-libraries]
        [--no-warm-libraries]

Four timings per model, interleaved run by run so that drifts in machine load hit all
of them alike (medians over `--runs`). Each round: same work, idle, back to back,
repeated; the same-work run comes right before the idle one it is paired with, and
0.1 s passes after each in-process run before a sandboxed one starts (`SETTLE_S`):

- sandboxed, idle worker: the job arrives at a worker whose zygote has its spare job
  child and spare loader child warm (`SandboxRunner.wait_for_spares`); the report
  must say the job ran in a spare.
- sandboxed, back to back: the next job arrives the moment the previous one ended. It
  runs in the successor the zygote forked when the previous job was handed its spare
  (spares.py), or in a fresh fork when that is not ready yet; how many of each is
  printed.
- warm in-process, same work: the same `engine.pipeline.export.run_export` in this process,
  which imported the model libraries the zygote warmed and ran the zygote's warm-up,
  round trip in-process (no isolation at all). Before
  each run torch's fake-tensor dispatch cache (`FakeTensorMode.cache`, class-level,
  keyed by op and shapes) is put back to its state after the warm-up, the state every
  sandboxed child starts from; the heap is frozen after the warm-up (`gc.freeze()`),
  as the zygote's is. Without that, this process would skip the shape
  propagation of every op it has seen with these shapes before: less work.
- warm in-process, same model repeated: as above without the reset (the baseline of
  this benchmark before spares existed). It exports the same model again and again, so
  it hits its own cache on every op: the best case of an unisolated worker, one a
  service sees only when the same shapes come back.

overhead = median(sandboxed, as the worker sees it) - median(warm in-process, same
work); the overhead against the repeated-model baseline is printed too. Because the
timings are interleaved, the median of the per-run differences (sandboxed minus
same-work of the same round) and their quartiles are printed as well: on a shared,
noisy machine they move less with load drifts than a difference of medians. So do
the lower quartiles (the runs least slowed by other tenants), also printed. Every variant
does load, trace, decompose, verify, save and the round trip. Also reported: RSS of the
zygote, private memory of the ready spares, RSS of the idle worker process, and each
variant's stage times (from the reports).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
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
SETTLE_S = 0.1
"""After an in-process run: this process's OpenMP threads spin-wait for more work for a
while (libgomp's default spin count), taking a core from a sandboxed job run next."""


def rss_mb(pid: int | str = "self") -> float:
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def private_mb(pid: int) -> float:
    """Memory only this process holds (not shared with the zygote)."""
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        total = 0
        for line in handle:
            if line.startswith(("Private_Clean:", "Private_Dirty:")):
                total += int(line.split()[1])
    return total / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=9)
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-baseline-libraries",
        action="store_true",
        help="the in-process baseline imports torch alone, not the zygote's warm libraries",
    )
    parser.add_argument(
        "--no-warm-libraries",
        action="store_true",
        help="the zygote warms no model library (warm_libraries=[]), so neither side has any",
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="torchport-bench-"))
    os.chmod(root, 0o755)
    files = {}
    for index, (name, source) in enumerate(MODELS.items()):
        path = root / f"model{index}.py"
        path.write_text(source)
        files[name] = path

    from worker.sandbox import SandboxJob, SandboxRunner, SandboxSettings

    warm: dict[str, list[str]] = {"warm_libraries": []} if args.no_warm_libraries else {}
    runner = SandboxRunner(SandboxSettings(work_root=root / "work", **warm)).start()
    worker_rss = rss_mb()
    assert runner.zygote_pid is not None
    zygote_rss = rss_mb(runner.zygote_pid)
    assert runner.wait_for_spares(60), "the spares did not get ready"
    spare_pids = runner.zygote_children()
    spare_private = [private_mb(pid) for pid in spare_pids]

    import torch  # noqa: F401  (only now: the worker side above never imported it)
    from torch._subclasses.fake_tensor import FakeTensorMode

    from engine.load.model import Upload
    from engine.pipeline import export as pipeline
    from engine.serialize import roundtrip
    from schemas import ExportOptions
    from worker.sandbox.zygote import warmup

    # The zygote's state, in this process: the model libraries it imported, then its
    # warm-up (the zygote's order). Without them the two would not do the same work: an
    # import registers op namespaces that torch's decomposition looks through.
    libraries = [] if args.no_baseline_libraries else runner.zygote_hello["libraries"]["imported"]
    for library in libraries:
        importlib.import_module(library)
    pipeline.warm_up(root / "warm")  # the zygote's warm-up, in this process
    (root / "warm-full").mkdir()
    warmup.warm_full_pipeline(root / "warm-full")
    after_warm_up = dict(FakeTensorMode.cache)
    gc.collect()
    gc.freeze()  # as the zygote does: collections never walk the warm-up's heap
    layers: list[str] = []
    in_spare: list[bool] = []
    """Per back-to-back job, whether it ran in a spare."""
    stages: dict[tuple[Path, bool | None], list[dict[str, float]]] = defaultdict(list)
    """Per model and variant (idle True, back to back False, same work None), each run's
    stage durations from its report."""
    counter = iter(range(1 << 30))

    def sandboxed(path: Path, want_spare: bool) -> float:
        nonlocal layers
        job_dir = root / f"sandboxed-{next(counter)}"
        started = time.perf_counter()
        result = runner.run(
            SandboxJob(
                model=path, inputs=None, weights=None, options=ExportOptions(), job_dir=job_dir
            )
        )
        elapsed = time.perf_counter() - started
        assert result.report.status == "succeeded", result.error
        assert result.report.sandbox is not None
        if want_spare:
            assert result.report.sandbox.details["spare"] is True
        else:
            in_spare.append(result.report.sandbox.details["spare"])
        layers = result.report.sandbox.layers
        stages[(path, want_spare)].append({s.name: s.duration_s for s in result.report.stages})
        return elapsed

    def in_process(path: Path, reset: bool) -> float:
        if reset:
            FakeTensorMode.cache.clear()
            FakeTensorMode.cache.update(after_warm_up)
        out = root / f"warm-{next(counter)}"
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
        if reset:
            stages[(path, None)].append({s.name: s.duration_s for s in exported.report.stages})
        return elapsed

    kinds = ("idle", "back_to_back", "same_work", "repeated")
    times: dict[str, dict[str, list[float]]] = {
        name: {kind: [] for kind in kinds} for name in files
    }
    try:
        for run in range(args.runs + 1):
            for name, path in files.items():
                assert runner.wait_for_spares(60)  # nothing else runs while in-process runs
                same_work = in_process(path, reset=True)
                time.sleep(SETTLE_S)
                idle = sandboxed(path, want_spare=True)
                back = sandboxed(path, want_spare=False)
                assert runner.wait_for_spares(60)
                repeated = in_process(path, reset=False)  # this model's shapes are cached
                time.sleep(SETTLE_S)
                if run:  # the first round warms the page cache for each model's files
                    values = (idle, back, same_work, repeated)
                    for kind, value in zip(kinds, values, strict=True):
                        times[name][kind].append(value)
    finally:
        runner.close()

    rows = []
    for name in files:
        med = {kind: statistics.median(times[name][kind]) for kind in kinds}
        rows.append(
            {
                "model": name,
                **{f"{kind}_s": value for kind, value in med.items()},
                "overhead_idle_ms": (med["idle"] - med["same_work"]) * 1000,
                "overhead_back_to_back_ms": (med["back_to_back"] - med["same_work"]) * 1000,
                "overhead_idle_vs_repeated_ms": (med["idle"] - med["repeated"]) * 1000,
            }
        )
    print(f"layers: {', '.join(layers)}; runs per cell: {args.runs} (median)")
    print(
        "| model | warm in-process, same work (s) | sandboxed, idle worker (s) "
        "| **overhead** (ms) | sandboxed, back to back (s) | overhead (ms) "
        "| warm in-process, same model repeated (s) | idle overhead vs repeated (ms) |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['model']} | {row['same_work_s']:.3f} | {row['idle_s']:.3f} | "
            f"**{row['overhead_idle_ms']:.0f}** | {row['back_to_back_s']:.3f} | "
            f"{row['overhead_back_to_back_ms']:.0f} | {row['repeated_s']:.3f} | "
            f"{row['overhead_idle_vs_repeated_ms']:.0f} |"
        )
    for name in files:
        paired = sorted(
            (idle - same) * 1000
            for idle, same in zip(times[name]["idle"], times[name]["same_work"], strict=True)
        )
        q1, _, q3 = statistics.quantiles(paired, n=4)
        low_idle = statistics.quantiles(times[name]["idle"], n=4)[0]
        low_same = statistics.quantiles(times[name]["same_work"], n=4)[0]
        print(
            f"{name}: per-run idle - same work: median {statistics.median(paired):.0f} ms "
            f"(quartiles {q1:.0f} / {q3:.0f} ms); lower quartiles: idle {low_idle * 1000:.0f}"
            f" ms, same work {low_same * 1000:.0f} ms, difference "
            f"{(low_idle - low_same) * 1000:.0f} ms"
        )
        rows[list(files).index(name)]["paired_idle_ms"] = statistics.median(paired)
    print(f"back-to-back jobs in a spare: {sum(in_spare)} of {len(in_spare)}")
    print(f"baseline's libraries (the zygote's): {', '.join(libraries) or 'none'}")
    print("stages (ms, medians; the rest of a sandboxed job's time is outside its stages):")
    print("| model | stage | same work | idle | back to back |")
    print("| --- | --- | ---: | ---: | ---: |")
    breakdown: dict[str, dict[str, list[float]]] = {}
    for name, path in files.items():
        per = {v: stages[(path, v)][1:] for v in (None, True, False)}  # not the warm round
        breakdown[name] = {}
        for stage in [*per[None][0], "(sum)"]:
            cells = [
                statistics.median(
                    sum(run.values()) if stage == "(sum)" else run.get(stage, 0.0)
                    for run in per[variant]
                )
                * 1000
                for variant in (None, True, False)
            ]
            breakdown[name][stage] = cells
            print(f"| {name} | {stage} | " + " | ".join(f"{ms:.0f}" for ms in cells) + " |")
    print(f"fake-tensor cache entries after the warm-up: {len(after_warm_up)}")
    print(
        f"zygote RSS: {zygote_rss:.0f} MB; ready spares' private memory: "
        + ", ".join(f"{mb:.0f} MB" for mb in spare_private)
        + f"; idle worker RSS (runner started): {worker_rss:.0f} MB"
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "rows": rows,
                    "zygote_rss_mb": zygote_rss,
                    "spare_private_mb": spare_private,
                    "worker_rss_mb": worker_rss,
                    "layers": layers,
                    "back_to_back_in_spare": in_spare,
                    "baseline_libraries": libraries,
                    "stages_ms": breakdown,
                    "times": times,
                },
                indent=2,
            )
        )

    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
