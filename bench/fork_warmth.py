"""How much slower a freshly forked child exports than a child that warmed itself up first.

Forks from a warm, single-threaded process (like the sandbox's zygote, without lockdown)
and times one `run_export` of the same model in each child: "cold" runs it at once,
"prewarmed" first runs the zygote's whole-pipeline warm-up itself (what the first spare
of a kind does), "prefaulted" first faults in the pages that warm-up touched, learned
once from a prewarmed fork (worker/sandbox/zygote/pages.py: what later spares and fresh forks
do). Per mode: the median time to warm, to export, and the page faults during the export.

    python bench/fork_warmth.py [--runs 5] [--model tests/models/docs_plain_function.py]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import tempfile
import time
from array import array
from collections.abc import Callable
from pathlib import Path

import torch

from engine.load.model import Upload
from engine.pipeline import export as pipeline
from engine.serialize import roundtrip
from schemas import ExportOptions
from worker.sandbox.zygote import pages, warmup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--model", type=Path, default=Path("tests/models/docs_plain_function.py"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="torchport-fork-"))
    pipeline.warm_up(root / "warm")
    (root / "warm-full").mkdir()
    warmup.warm_full_pipeline(root / "warm-full")
    gc.collect()
    gc.freeze()
    warmup.collapse_heap()  # as the zygote does

    def job(tag: str) -> float:
        started = time.perf_counter()
        request = pipeline.ExportRequest(
            Upload(args.model), ExportOptions(), root / f"out-{tag}", root / f"work-{tag}"
        )
        pipeline.run_export(request, roundtrip_runner=roundtrip.run_in_process)
        return time.perf_counter() - started

    def warm_full() -> None:
        scratch = root / f"spare-{os.getpid()}"
        scratch.mkdir()
        warmup.warm_full_pipeline(scratch)
        gc.collect()
        gc.freeze()

    def in_child(work: Callable[[], list[float]]) -> list[float]:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            os.write(write_end, json.dumps(work()).encode())
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as handle:
            values: list[float] = json.loads(handle.read())
        os.waitpid(pid, 0)
        return values

    maps = pages.mappings()

    def learn() -> list[float]:
        warm_full()
        return list(pages.learn(maps))

    learned = array("Q", [int(x) for x in in_child(learn)])
    counts = pages.count(learned)

    def run(mode: str) -> list[float]:
        started = time.perf_counter()
        if mode == "prewarmed":
            warm_full()
        elif mode == "prefaulted":
            pages.prefault(learned)
        warmed = time.perf_counter() - started
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        exported = job(f"{mode}-{os.getpid()}")
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
        return [warmed, exported, faults]

    times: dict[str, list[list[float]]] = {"cold": [], "prewarmed": [], "prefaulted": []}
    for _ in range(args.runs):
        for mode in times:
            times[mode].append(in_child(lambda mode=mode: run(mode)))  # type: ignore[misc]
    print(
        f"{args.model.name}, {args.runs} runs each, medians; learned pages: "
        f"{counts['write']} written, {counts['read']} mapped"
    )
    print("| child | warming (ms) | export (s) | page faults in the export |")
    print("| --- | ---: | ---: | ---: |")
    for mode, values in times.items():
        warmed, exported, faults = (statistics.median(v[i] for v in values) for i in range(3))
        print(f"| {mode} | {warmed * 1000:.0f} | {exported:.3f} | {faults:.0f} |")


if __name__ == "__main__":
    main()
