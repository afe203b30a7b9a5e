"""Recurrent models to ONNX: the engine's `onnx` target against plain `torch.onnx.export`.

    python bench/onnx_native_ops.py [--frames 160] [--kinds lstm,gru,rnn] [--runs 50]
                                    [--before] [--json OUT]

A speaker encoder of resemblyzer's shape (40 mel features in, a 3-layer `nn.LSTM` /
`nn.GRU` / `nn.RNN` of hidden size 256, batch_first, the last layer's final hidden state
through Linear(256, 256) + ReLU, L2-normalised), batch 2 x `--frames` frames, static
shapes. Per kind, in one process (after one tiny conversion, so that neither side pays
the exporter's first-use imports):

- plain: `torch.onnx.export(module, dynamo=True, optimize=True)`, wall time (it traces
  with `torch.export.export` itself);
- trace: `torch.export.export`, the job's tracing stage;
- decompose: `engine.decompose.decomposition.decompose` in `core_aten` mode, the job's decomposing
  stage (program.pt2, the recurrent layer kept whole), and the same with
  `preserve: ["aten.<op>.input"]`;
- convert: `engine.targets.run_target(
        "onnx",
        targets.TargetJob(...)`'s `duration_s` (convert and load),
    )
  and its whole time with verification against eager (the example; no dynamic dims, so
  no further samples);
- with `--before`: `engine.targets.onnx.convert` of the program decomposed with
  `unroll_recurrent` (the recurrence unrolled over its frames; minutes at 160 frames);
- nodes / native: the ONNX graph's node count and its `LSTM` / `GRU` / `RNN` nodes;
- ORT ms: median of `--runs` ONNX Runtime runs (CPU provider, default threads) on the
  example, after 5 warm-up runs;
- job: the whole export in-process (`engine.pipeline.export.run_export` of a model file
  holding the same module and example, options `{"targets": ["onnx"]}`: tracing,
  decomposing, verifying, serializing with its round trip, converting, profiling off),
  wall time, and its ratio to plain.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import targets
from engine.decompose import decomposition
from engine.targets import onnx as onnx_target
from schemas import DecompositionOptions, ExportOptions

ATEN = {"lstm": "aten.lstm.input", "gru": "aten.gru.input", "rnn": "aten.rnn_tanh.input"}
NATIVE = {"lstm": "LSTM", "gru": "GRU", "rnn": "RNN"}


class SpeakerEncoder(torch.nn.Module):
    """resemblyzer's VoiceEncoder shape with the recurrent layer of `kind`."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.rnn = getattr(torch.nn, NATIVE[kind])(40, 256, 3, batch_first=True)
        self.linear = torch.nn.Linear(256, 256)
        self.relu = torch.nn.ReLU()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, hidden = self.rnn(mels)
        if isinstance(hidden, tuple):  # LSTM: (h, c)
            hidden = hidden[0]
        embedding = self.relu(self.linear(hidden[-1]))
        return embedding / torch.norm(embedding, dim=1, keepdim=True)


def timed(fn: Any) -> tuple[Any, float]:
    started = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - started


def graph(path: Path) -> tuple[int, Counter[str]]:
    import onnx

    nodes = onnx.load(str(path)).graph.node
    return len(nodes), Counter(node.op_type for node in nodes)


def latency_ms(path: Path, x: torch.Tensor, runs: int) -> float:
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.numpy()}
    for _ in range(5):
        session.run(None, feed)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        session.run(None, feed)
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


MODEL_FILE = """
import torch
from torch import nn


class SpeakerEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.{layer}(40, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)

    def forward(self, mels):
        _, hidden = self.rnn(mels)
        if isinstance(hidden, tuple):
            hidden = hidden[0]
        embedding = torch.relu(self.linear(hidden[-1]))
        return embedding / torch.norm(embedding, dim=1, keepdim=True)


torch.manual_seed(0)
model = SpeakerEncoder().eval()
example_args = (torch.randn(2, {frames}, 40),)
"""


def job(kind: str, frames: int, work: Path) -> tuple[float, int]:
    """The whole export of the same module as a job would run it: wall seconds and the
    ONNX model's node count."""
    from engine.load.model import Upload
    from engine.pipeline.export import ExportRequest, run_export

    source = work / f"{kind}_job.py"
    source.write_text(MODEL_FILE.format(layer=NATIVE[kind], frames=frames))
    request = ExportRequest(
        upload=Upload(model=source),
        options=ExportOptions.model_validate({"targets": ["onnx"]}),
        out_dir=work / f"{kind}_job",
        work_dir=work / f"{kind}_job_work",
    )
    result, seconds = timed(lambda: run_export(request))
    assert result.report.status == "succeeded", result.report.error
    assert result.report.targets["onnx"].status == "succeeded"
    nodes, _ = graph(work / f"{kind}_job" / "model.onnx")
    return seconds, nodes


def bench(kind: str, frames: int, runs: int, before: bool, work: Path) -> dict[str, Any]:
    torch.manual_seed(0)
    module = SpeakerEncoder(kind).eval()
    x = torch.randn(2, frames, 40)
    row: dict[str, Any] = {"kind": kind, "frames": frames}

    plain_path = work / f"{kind}_plain.onnx"
    plain, row["plain_s"] = timed(
        lambda: torch.onnx.export(module, (x,), dynamo=True, optimize=True, verbose=False)
    )
    plain.save(str(plain_path))
    row["plain_nodes"], ops = graph(plain_path)
    row["plain_native"] = ops[NATIVE[kind]]

    traced, row["trace_s"] = timed(lambda: torch.export.export(module, (x,)))
    decomposed, row["decompose_s"] = timed(
        lambda: decomposition.decompose(traced, DecompositionOptions())
    )
    row["program_nodes"] = len(decomposed.ep.graph.nodes)
    _, row["decompose_preserve_s"] = timed(
        lambda: decomposition.decompose(traced, DecompositionOptions(preserve=[ATEN[kind]]))
    )

    out = work / kind
    out.mkdir()
    result, row["target_s"] = timed(
        lambda: targets.run_target(
            "onnx",
            targets.TargetJob(
                program=decomposed.ep,
                traced=traced,
                pristine=module,
                args=(x,),
                kwargs={},
                out_dir=out,
                options=ExportOptions(targets=["onnx"]),
            ),
        )
    )
    assert result.status == "succeeded", result.error
    assert result.verification is not None and result.verification.passed
    row["convert_s"] = result.duration_s
    row["max_abs_error"] = max(
        out.max_abs_error or 0.0 for s in result.verification.samples for out in s.outputs
    )
    row["nodes"], ops = graph(out / "model.onnx")
    row["native"] = ops[NATIVE[kind]]
    row["ratio"] = row["convert_s"] / row["plain_s"]
    row["ort_ms"] = latency_ms(out / "model.onnx", x, runs)
    row["plain_ort_ms"] = latency_ms(plain_path, x, runs)

    row["job_s"], row["job_nodes"] = job(kind, frames, work)
    row["job_ratio"] = row["job_s"] / row["plain_s"]
    if before:
        old = work / f"{kind}_before.onnx"
        unrolled = decomposition.decompose(traced, DecompositionOptions(unroll_recurrent=True))
        _, row["before_convert_s"] = timed(lambda: onnx_target.convert(unrolled.ep, (x,), {}, old))
        row["before_nodes"], _ = graph(old)
        row["before_ort_ms"] = latency_ms(old, x, runs)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=160)
    parser.add_argument("--kinds", default="lstm,gru,rnn")
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--before", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    import logging

    logging.disable(logging.WARNING)  # the exporter's "torchvision is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        # the exporter's first use imports and builds its registry (~8 s): pay it here
        torch.onnx.export(torch.nn.Linear(2, 2), (torch.randn(1, 2),), dynamo=True)
        rows = [
            bench(kind, args.frames, args.runs, args.before, work) for kind in args.kinds.split(",")
        ]
    print(f"torch {torch.__version__}, {platform.processor() or platform.machine()}")
    columns = [
        "kind", "frames", "plain_s", "trace_s", "decompose_s", "decompose_preserve_s",
        "convert_s", "target_s", "ratio", "plain_nodes", "nodes", "plain_native", "native",
        "program_nodes", "job_s", "job_ratio", "job_nodes", "plain_ort_ms", "ort_ms",
        "max_abs_error",
        "before_convert_s", "before_nodes", "before_ort_ms",
    ]  # fmt: skip
    shown = [c for c in columns if any(c in row for row in rows)]
    print("| " + " | ".join(shown) + " |")
    print("|" + " --- |" * len(shown))
    for row in rows:
        cells = [row.get(c) for c in shown]
        print(
            "| " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in cells) + " |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
