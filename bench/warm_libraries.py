"""What warm model libraries (setting `warm_libraries`) cost the zygote and save a job.

    python bench/warm_libraries.py [--runs 6]

Two workers' sandboxes are started one after the other, one with the default (the
installed model libraries warmed), one with `warm_libraries=[]`. For each: how long
`SandboxRunner.start()` took and the zygote's share spent on the libraries (probes and
imports), the zygote's RSS, the first job right after start (a tiny BERT, transformers
`BertModel`: a fresh fork, the spares not ready). Then `--runs` BERT jobs and `--runs`
tiny (Linear 8→8) jobs at each idle worker (each in a warm spare), alternated job by
job between the two workers so that drifts in machine load hit both alike: medians of
the whole job (as the worker sees it) and of its loading stage. Then, in this process:
the cost of one fork (fork, child `_exit`, wait) of a single-threaded warm torch
process before and after it imports the same libraries, its heap collapsed into huge
pages as the zygote's is (median of 30).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from worker.sandbox.processes import read_status_kb

BERT = """
import torch
from transformers import BertConfig, BertModel

torch.manual_seed(0)
config = BertConfig(
    vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
    intermediate_size=64, max_position_embeddings=64,
)
model = BertModel(config).eval()
example_args = (torch.randint(0, 100, (2, 16)),)
example_kwargs = {"attention_mask": torch.ones(2, 16, dtype=torch.long)}
"""

TINY = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
example_args = (torch.randn(2, 8),)
"""


DENIED: dict[tuple[bool, str], list[bool]] = {}
"""Per worker and model, whether each job's report had a `sandbox_denied` warning."""


def rss_mb(pid: int | str = "self") -> float:
    return read_status_kb("VmRSS", f"/proc/{pid}/status") / 1024


def start_worker(root: Path, warm: bool, files: dict[str, Path]) -> dict[str, Any]:
    """Start a worker's sandbox and run one BERT job on it at once."""
    from worker.sandbox import SandboxRunner, SandboxSettings

    settings = SandboxSettings(
        work_root=Path(tempfile.mkdtemp(dir=root)), warm_libraries=None if warm else []
    )
    started = time.perf_counter()
    runner = SandboxRunner(settings).start()
    start_s = time.perf_counter() - started
    hello = runner.zygote_hello
    assert runner.zygote_pid is not None
    libraries = hello.get("libraries") or {}
    first = job(runner, root, files["bert"], warm, want_spare=False)
    return {
        "runner": runner,
        "start_s": start_s,
        "libraries_s": float(libraries.get("seconds", 0.0)),
        "imported": libraries.get("imported", []),
        "zygote_rss_mb": rss_mb(runner.zygote_pid),
        "first_s": first[0],
        "first_loading_s": first[1],
    }


def job(runner: Any, root: Path, model: Path, warm: bool, want_spare: bool) -> tuple[float, float]:
    """One job's wall time as the worker sees it, and its loading stage's."""
    from schemas import ExportOptions
    from worker.sandbox import SandboxJob

    began = time.perf_counter()
    job_dir = Path(tempfile.mkdtemp(dir=root))
    result = runner.run(SandboxJob(model, None, None, ExportOptions(), job_dir))
    elapsed = time.perf_counter() - began
    assert result.report.status == "succeeded", result.error
    assert result.report.sandbox is not None
    assert result.report.sandbox.details["spare"] is want_spare
    assert bool(result.report.sandbox.details["warm_libraries"]) is warm
    loading = next(s.duration_s for s in result.report.stages if s.name == "loading")
    denied = any(w.code == "sandbox_denied" for w in result.report.warnings)
    DENIED.setdefault((warm, model.stem), []).append(denied)
    return elapsed, loading


def fork_ms(count: int = 30) -> float:
    times = []
    for _ in range(count):
        started = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def fork_cost(with_libraries: bool) -> tuple[float, float]:
    """(RSS MB, fork ms) of a warm single-threaded torch process, in the zygote's order:
    the libraries (or none), the warm-up, the heap frozen and collapsed."""
    import torch

    from worker.sandbox.zygote import warmup
    from worker.sandbox.zygote.warm_libraries import warm_libraries

    torch.set_num_threads(1)
    warm_libraries(None if with_libraries else [])
    warmup.warm_full_pipeline(Path(tempfile.mkdtemp()))
    gc.collect()
    gc.freeze()
    warmup.collapse_heap()
    return rss_mb(), fork_ms()


def fork_costs() -> tuple[tuple[float, float], tuple[float, float]]:
    """`fork_cost` without and with the libraries, each in a fresh interpreter."""
    found = []
    for flag in ("", "--fork-cost-with-libraries"):
        done = subprocess.run(
            [sys.executable, __file__, "--fork-cost", *([flag] if flag else [])],
            capture_output=True,
            text=True,
            check=True,
        )
        rss, ms = json.loads(done.stdout.strip().splitlines()[-1])
        found.append((float(rss), float(ms)))
    return found[0], found[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--fork-cost", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fork-cost-with-libraries", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.fork_cost:
        print(json.dumps(fork_cost(args.fork_cost_with_libraries)))
        return
    root = Path(tempfile.mkdtemp(prefix="torchport-warm-libs-"))
    os.chmod(root, 0o755)
    files = {}
    for name, source in (("bert", BERT), ("tiny", TINY)):
        files[name] = root / f"{name}.py"
        files[name].write_text(source)
    workers: dict[bool, dict[str, Any]] = {}
    idle: dict[tuple[bool, str], list[tuple[float, float]]] = {}
    try:
        for warm in (True, False):
            workers[warm] = start_worker(root, warm, files)
        for index in range(args.runs):
            for name in files:
                for warm in (True, False) if index % 2 == 0 else (False, True):
                    runner = workers[warm]["runner"]
                    for other in workers.values():  # nothing else runs meanwhile
                        assert other["runner"].wait_for_spares(120), "spares not ready"
                    timing = job(runner, root, files[name], warm, want_spare=True)
                    idle.setdefault((warm, name), []).append(timing)
    finally:
        for worker in workers.values():
            worker["runner"].close()
    without, with_libraries = fork_costs()
    shutil.rmtree(root, ignore_errors=True)
    for (warm, name), values in idle.items():
        workers[warm][f"{name}_s"] = statistics.median(v[0] for v in values)
        workers[warm][f"{name}_loading_s"] = statistics.median(v[1] for v in values)
    rows = {warm: [worker] for warm, worker in workers.items()}
    imported: list[str] = next((r["imported"] for r in rows[True] if r["imported"]), [])
    print(
        f"libraries warmed: {', '.join(imported) or 'none'}; {args.runs} idle jobs per model "
        "and worker, alternated between the two workers; medians"
    )
    keys = [
        ("start_s", "runner start (s)", 2),
        ("libraries_s", "of which libraries (s)", 2),
        ("zygote_rss_mb", "zygote RSS (MB)", 0),
        ("first_s", "first BERT job after start (s)", 3),
        ("first_loading_s", "its loading stage (s)", 3),
        ("bert_s", "BERT job, idle worker (s)", 3),
        ("bert_loading_s", "its loading stage (s)", 3),
        ("tiny_s", "tiny job, idle worker (s)", 3),
    ]
    print("| measure | libraries warm | not warm |")
    print("| --- | ---: | ---: |")
    for key, label, digits in keys:
        cells = [statistics.median(r[key] for r in rows[warm]) for warm in (True, False)]
        print(f"| {label} | {cells[0]:.{digits}f} | {cells[1]:.{digits}f} |")
    print(f"| fork of a warm torch process (ms) | {with_libraries[1]:.2f} | {without[1]:.2f} |")
    print(f"| its RSS (MB) | {with_libraries[0]:.0f} | {without[0]:.0f} |")
    for (warm, name), seen in sorted(DENIED.items()):
        where = "warm" if warm else "not warm"
        print(f"{name} jobs, libraries {where}: {sum(seen)} of {len(seen)} had sandbox_denied")


if __name__ == "__main__":
    main()
