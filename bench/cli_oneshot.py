"""One model through `torchport export` (sandbox on, verification on) against a cold
`python export.py` that does what a person writes by hand: import the model file, then
`torch.export.export` + `run_decompositions()` + `torch.export.save`.

Both are whole fresh processes, timed from the outside; runs alternate (plain first,
then torchport) so drift hits both alike. Prints medians, the median of the paired
ratios, and a Markdown row for docs/engine.md.

    python bench/cli_oneshot.py [MODEL.py ...] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN = """
import runpy, sys, torch
ns = runpy.run_path(sys.argv[1])
model = ns.get("model")
if isinstance(model, type):
    model = model()
args = tuple(ns.get("example_args", ()))
kwargs = dict(ns.get("example_kwargs") or {})
ep = torch.export.export(model, args, kwargs, dynamic_shapes=ns.get("dynamic_shapes"))
ep = ep.run_decompositions()
torch.export.save(ep, sys.argv[2])
"""


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{argv} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed


def measure(model: Path, runs: int) -> tuple[list[float], list[float]]:
    torchport = str(Path(sys.executable).with_name("torchport"))
    plain, ours = [], []
    with tempfile.TemporaryDirectory(prefix="torchport-oneshot-") as tmp:
        script = Path(tmp) / "export.py"
        script.write_text(PLAIN)
        for _ in range(runs):
            plain.append(timed([sys.executable, str(script), str(model), f"{tmp}/plain.pt2"]))
            ours.append(timed([torchport, "export", str(model), "--out", f"{tmp}/out"]))
    return plain, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    models = args.models or [ROOT / "examples" / "tiny_transformer.py"]
    rows = []
    for model in models:
        plain, ours = measure(model, args.runs)
        ratios = [o / p for o, p in zip(ours, plain, strict=True)]
        row = (
            f"| {model.name} | {statistics.median(plain):.2f} s | "
            f"{statistics.median(ours):.2f} s | {statistics.median(ratios):.2f} | {args.runs} |"
        )
        print(f"{model.name}: plain {plain}\n  torchport {ours}", flush=True)
        rows.append(row)
    print("| model | cold `python export.py` | `torchport export` | ratio (paired median) | runs |")
    print("| --- | --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
