"""Deployment targets: conversion time, artifact size and run latency against eager.

    python bench/targets.py [--runs 200] [--targets onnx,aoti,executorch] [--json OUT]

For three small models (a 3-layer MLP, a small conv net, a TransformerEncoder layer),
each exported with a dynamic batch or sequence dim, every target is converted by the
engine's own functions (`engine.targets.<name>.convert`, then `.load`), as
`engine.targets.run_target` does, minus verification:

- convert: wall time of `convert` alone, cold: AOTInductor gets an empty
  `TORCHINDUCTOR_CACHE_DIR` per model, as a sandboxed job starts with (the first
  conversion of each target also pays its package imports, as a worker process would);
- size: the artifact's bytes (program.pt2 for comparison);
- latency: median of `--runs` calls on the example input, after 10 warm-up calls,
  for eager PyTorch, `ep.module()` (program.pt2 as torch runs it) and each runtime
  through the same runner the verification uses (so ONNX Runtime's numbers include the
  torch → numpy → torch copies); all single-process, torch's default threads.

Also checks every artifact's output against eager on the example (max abs error).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch.export import Dim

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import targets
from engine.targets.registry import TARGET_ARTIFACTS


class ConvNet(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv1(x)))
        x = torch.relu(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))


def models() -> list[tuple[str, torch.nn.Module, tuple[Any, ...], Any]]:
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 10),
    )  # fmt: skip
    encoder = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True)
    return [
        ("mlp", mlp, (torch.randn(8, 64),), ({0: Dim("batch", min=1, max=64)},)),
        ("convnet", ConvNet(), (torch.randn(4, 3, 32, 32),), ({0: Dim("batch", min=1, max=16)},)),
        ("encoder", encoder, (torch.randn(2, 16, 64),), ({1: Dim("seq", min=2, max=64)},)),
    ]


def median_ms(call: Callable[[], Any], runs: int) -> float:
    with torch.no_grad():
        for _ in range(10):
            call()
        times = []
        for _ in range(runs):
            started = time.perf_counter()
            call()
            times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def max_error(expected: torch.Tensor, actual: Any) -> float:
    (leaf,) = actual if isinstance(actual, list | tuple) else (actual,)
    return float((expected - leaf).abs().max())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--targets", default=",".join(targets.ORDER))
    parser.add_argument("--json", type=Path)
    opts = parser.parse_args(argv)
    chosen = [name for name in targets.ORDER if name in opts.targets.split(",")]
    rows: list[dict[str, Any]] = []
    work = Path(tempfile.mkdtemp(prefix="bench-targets-"))
    for label, module, args, dynamic in models():
        module.eval()
        traced = torch.export.export(module, args, dynamic_shapes=dynamic)
        program = traced.run_decompositions()
        with torch.no_grad():
            expected = module(*args)
        pt2 = work / f"{label}.program.pt2"
        torch.export.save(program, str(pt2))
        exported = program.module()
        rows.append(
            {
                "model": label,
                "target": "eager",
                "latency_ms": median_ms(partial(module, *args), opts.runs),
            }
        )
        rows.append(
            {
                "model": label,
                "target": "program.pt2",
                "size": pt2.stat().st_size,
                "latency_ms": median_ms(partial(exported, *args), opts.runs),
            }
        )
        for name in chosen:
            absent = targets.missing(name)
            if absent:
                rows.append({"model": label, "target": name, "error": f"missing {absent}"})
                continue
            target = importlib_target(name)
            out = work / label / name
            out.mkdir(parents=True)
            path = out / TARGET_ARTIFACTS[name]
            source = traced if name == "executorch" else program
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(out / "inductor-cache")
            started = time.perf_counter()
            target.convert(source, args, {}, path)
            convert_s = time.perf_counter() - started
            run = target.load(path, source)
            rows.append(
                {
                    "model": label,
                    "target": name,
                    "convert_s": convert_s,
                    "size": path.stat().st_size,
                    "latency_ms": median_ms(partial(run, args, {}), opts.runs),
                    "max_abs_error": max_error(expected, run(args, {})),
                }
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    print_table(rows)
    if opts.json:
        machine = {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "machine": platform.machine(),
            "torch": torch.__version__,
        }
        opts.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    return 0


def importlib_target(name: str) -> Any:
    import importlib

    return importlib.import_module(f"engine.targets.{name}")


def print_table(rows: list[dict[str, Any]]) -> None:
    eager = {row["model"]: row["latency_ms"] for row in rows if row["target"] == "eager"}
    print("| model | target | convert (s) | size (KiB) | latency (ms) | vs eager | max abs err |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        if "error" in row:
            print(f"| {row['model']} | {row['target']} | {row['error']} | | | | |")
            continue
        convert = f"{row['convert_s']:.1f}" if "convert_s" in row else ""
        size = f"{row['size'] / 1024:.0f}" if "size" in row else ""
        ratio = row["latency_ms"] / eager[row["model"]]
        error = f"{row['max_abs_error']:.1e}" if "max_abs_error" in row else ""
        print(
            f"| {row['model']} | {row['target']} | {convert} | {size} | "
            f"{row['latency_ms']:.3f} | {ratio:.2f}x | {error} |"
        )


if __name__ == "__main__":
    raise SystemExit(main())
