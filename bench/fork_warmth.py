"""How much slower a freshly forked child exports than a child that warmed itself up first.

Forks from a warm, single-threaded process (like the sandbox's zygote, without lockdown)
and times one `run_export` of the same model in each child: "cold" runs it at once,
"prewarmed" first runs a tiny export itself. The difference is what a pre-warmed spare
child would save per job.

    python bench/fork_warmth.py [--runs 5] [--model tests/models/docs_plain_function.py]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from engine import pipeline, roundtrip
from engine.model import Upload
from schemas import ExportOptions
from worker.sandbox import zygote


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", type=Path, default=Path("tests/models/docs_plain_function.py"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="torchport-fork-"))
    pipeline.warm_up(root / "warm")
    (root / "warm-full").mkdir()
    zygote._warm_full_pipeline(root / "warm-full")
    gc.collect()
    gc.freeze()

    def job(tag: str) -> float:
        started = time.perf_counter()
        request = pipeline.ExportRequest(
            Upload(args.model), ExportOptions(), root / f"out-{tag}", root / f"work-{tag}"
        )
        pipeline.run_export(request, roundtrip_runner=roundtrip.run_in_process)
        return time.perf_counter() - started

    times: dict[str, list[float]] = {"cold": [], "prewarmed": []}
    for _ in range(args.runs):
        for mode in times:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(read_end)
                if mode == "prewarmed":
                    pipeline.warm_up(root / f"spare-{os.getpid()}")
                os.write(write_end, json.dumps(job(f"{mode}-{os.getpid()}")).encode())
                os._exit(0)
            os.close(write_end)
            times[mode].append(json.loads(os.read(read_end, 64)))
            os.waitpid(pid, 0)
    print(f"{args.model.name}, {args.runs} runs each, median seconds")
    for mode, values in times.items():
        low, high = min(values), max(values)
        print(f"{mode}: {statistics.median(values):.3f} (min {low:.3f}, max {high:.3f})")


if __name__ == "__main__":
    main()
