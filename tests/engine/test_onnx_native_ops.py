"""Ops ONNX runs natively reach its converter undecomposed (docs/targets.md, *Native ops*).

`run_decompositions` with the default table unrolls `aten.lstm` / `aten.gru` /
`aten.rnn_tanh` / `aten.rnn_relu` over the time steps (hundreds of nodes per layer) and
expands `aten.scaled_dot_product_attention` into matmuls and a softmax. The `onnx` target
converts the program before decomposition, so the exporter keeps them as ONNX `LSTM`,
`GRU`, `RNN` and (opset 23) `Attention` nodes. `program.pt2`'s own decomposition keeps
the recurrent ops whole too unless `decomposition.unroll_recurrent` asks otherwise.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from engine import targets
from engine.decompose import decomposition
from schemas import DecompositionOptions, ExportOptions, TargetResult
from tests.engine.model_files import export_file

pytest.importorskip("onnxruntime", reason="target onnx needs onnxruntime")
onnx = pytest.importorskip("onnx", reason="target onnx needs onnx")

LAYERS = 3
FRAMES = 6


class SpeakerEncoder(torch.nn.Module):
    """resemblyzer's shape, smaller: a 3-layer recurrent net over mel frames, the last
    layer's final hidden state through Linear + ReLU, L2-normalised."""

    def __init__(self, kind: str, **rnn: Any) -> None:
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(8, 16, LAYERS, batch_first=True, **rnn)
        width = 32 if rnn.get("bidirectional") else 16
        self.linear = torch.nn.Linear(width, 16)
        self.relu = torch.nn.ReLU()

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        _, hidden = self.rnn(mels)
        if isinstance(hidden, tuple):  # LSTM: (h, c)
            hidden = hidden[0]
        last = torch.cat(list(hidden[-2:]), dim=-1) if self.linear.in_features == 32 else hidden[-1]
        embedding = self.relu(self.linear(last))
        return embedding / torch.norm(embedding, dim=1, keepdim=True)


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, 4, d // 4).transpose(1, 2) for z in self.qkv(x).split(d, dim=-1))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, d))


def convert(
    module: torch.nn.Module, args: tuple[Any, ...], out_dir: Path, **options: Any
) -> tuple[TargetResult, torch.export.ExportedProgram, Counter[str]]:
    """The `onnx` target as the pipeline runs it; the result, program.pt2's program and
    the model's node types."""
    torch.manual_seed(0)
    module.eval()
    traced = torch.export.export(module, args)
    program = decomposition.decompose(traced, DecompositionOptions()).ep
    result = targets.run_target(
        "onnx",
        targets.TargetJob(
            program=program,
            traced=traced,
            pristine=module,
            args=args,
            kwargs={},
            out_dir=out_dir,
            options=ExportOptions(targets=["onnx"], **options),
        ),
    )
    assert result.status == "succeeded", result.error
    assert result.verification is not None and result.verification.passed is True
    model = onnx.load(str(out_dir / "model.onnx"))
    return result, program, Counter(node.op_type for node in model.graph.node)


def ops(program: torch.export.ExportedProgram) -> set[str]:
    return {str(n.target) for n in program.graph.nodes if n.op == "call_function"}


@pytest.mark.parametrize(
    ("kind", "rnn", "op", "aten"),
    [
        ("LSTM", {}, "LSTM", "aten.lstm.input"),
        ("GRU", {}, "GRU", "aten.gru.input"),
        ("RNN", {}, "RNN", "aten.rnn_tanh.input"),
        ("RNN", {"nonlinearity": "relu", "bidirectional": True}, "RNN", "aten.rnn_relu.input"),
    ],
    ids=["lstm", "gru", "rnn_tanh", "rnn_relu_bidirectional"],
)
def test_a_recurrent_model_converts_to_native_onnx_ops(
    kind: str, rnn: dict[str, Any], op: str, aten: str, tmp_path: Path
) -> None:
    module = SpeakerEncoder(kind, **rnn)
    result, program, nodes = convert(module, (torch.randn(2, FRAMES, 8),), tmp_path)
    assert result.details["native_ops"] == [aten]
    assert "native_ops_failed" not in result.details
    # one native node per layer, nothing unrolled: the decomposed program converts to
    # hundreds of nodes (~30 per frame and layer), the native one to a few per layer
    assert nodes[op] == LAYERS
    assert sum(nodes.values()) <= 20 * LAYERS
    assert not {"Loop", "Scan"} & set(nodes)
    # program.pt2 keeps the layer whole as well; unrolled only when the options ask
    assert aten in ops(program)
    unrolled = decomposition.decompose(
        torch.export.export(module, (torch.randn(2, FRAMES, 8),)),
        DecompositionOptions(unroll_recurrent=True),
    )
    assert aten not in ops(unrolled.ep)
    assert sum(node.op == "call_function" for node in unrolled.ep.graph.nodes) > FRAMES * LAYERS
    assert "recurrent_ops_kept" not in [w.code for w in unrolled.warnings]


def test_attention_reaches_onnx_as_one_attention_node(tmp_path: Path) -> None:
    result, program, nodes = convert(
        Attention(), (torch.randn(2, 6, 16),), tmp_path, onnx={"opset": 23}
    )
    assert nodes["Attention"] == 1
    assert "Softmax" not in nodes
    assert result.details["native_ops"] == ["aten.scaled_dot_product_attention.default"]
    assert "aten.scaled_dot_product_attention.default" not in ops(program)


def test_a_program_the_exporter_fails_on_whole_is_converted_decomposed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # hf_t5 and hf_swin of bench/model_suite: torch's meta kernel for the kept SDPA lays
    # its output out otherwise than eager did, and a later `view` of it fails
    real = torch.onnx.export

    def fails_whole(program: Any, *args: Any, **kwargs: Any) -> Any:
        if "aten.scaled_dot_product_attention.default" in ops(program):
            raise ValueError("Cannot view a tensor with shape torch.Size([2, 6, 4, 4])")
        return real(program, *args, **kwargs)

    monkeypatch.setattr(torch.onnx, "export", fails_whole)
    result, _, nodes = convert(Attention(), (torch.randn(2, 6, 16),), tmp_path, onnx={"opset": 23})
    assert "Attention" not in nodes and nodes["Softmax"] == 1
    assert result.details["native_ops"] == []
    assert "ValueError" in result.details["native_ops_failed"]  # the exporter's error


class Projected(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(8, 16, 2, batch_first=True, proj_size=4)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        return self.rnn(mels)[0]


def test_an_lstm_with_a_projection_is_unrolled_for_onnx(tmp_path: Path) -> None:
    # ONNX LSTM has no projection: torch_lib's LSTM node for it makes a model ONNX
    # Runtime refuses to load, so this one is decomposed before conversion
    _, _, nodes = convert(Projected(), (torch.randn(2, FRAMES, 8),), tmp_path)
    assert "LSTM" not in nodes


def test_a_recurrent_job_keeps_the_layer_whole_from_program_to_onnx(tmp_path: Path) -> None:
    # the whole pipeline: program.pt2 calls the LSTM as one op (no unrolled time steps
    # to decompose), verifies and round-trips; the ONNX model has one LSTM node per layer.
    # Its batch may be 0 (Dim's default min), on which ONNX Runtime aborts the process:
    # that sample is refused before it runs, and the model kept for the range it ran
    result = export_file(
        tmp_path, "speaker_lstm.py", {"targets": ["onnx"], "target_range": "verified"}
    )
    report = result.report
    assert report.status == "succeeded", report.error
    assert report.decomposition is not None
    assert report.decomposition.ops_after["aten.lstm.input"] == 1
    assert "aten.lstm.input" in report.decomposition.non_core_aten_ops
    kept = [w.details for w in report.warnings if w.code == "recurrent_ops_kept"]
    assert kept == [{"ops": ["aten.lstm.input"], "counts": {"aten.lstm.input": 1}}]
    assert report.verification is not None and report.verification.verdict == "verified"
    assert [s.input_shapes["args[0]"][0] for s in report.verification.samples][:3] == [3, 0, 64]
    assert report.verification.roundtrip is not None
    assert report.verification.roundtrip.status == "passed"
    onnx_result = report.targets["onnx"]
    assert onnx_result.status == "succeeded", onnx_result.error
    assert onnx_result.details["recurrent_nodes"] == LAYERS
    assert onnx_result.details["verified_range"] == {"args[0]": {"0": [3, 64]}}
    assert onnx_result.verification is not None
    statuses = {s.label: (s.status, s.bound) for s in onnx_result.verification.samples}
    assert statuses["min"] == ("skipped", "runtime")
    assert statuses["example"][0] == statuses["max"][0] == "passed"
    nodes = Counter(n.op_type for n in onnx.load(str(tmp_path / "out" / "model.onnx")).graph.node)
    assert nodes["LSTM"] == LAYERS


def test_an_empty_batch_never_reaches_onnx_runtimes_recurrent_nodes(tmp_path: Path) -> None:
    # ONNX Runtime 1.32 aborts the process (std::terminate) on an empty batch through
    # LSTM: the target's runner refuses it, and the job fails the target, not the process
    result = export_file(
        tmp_path, "speaker_lstm.py", {"targets": ["onnx"], "verify": {"samples": 1}}
    )
    report = result.report
    assert report.status == "succeeded", report.error
    onnx_result = report.targets["onnx"]
    assert onnx_result.status == "failed" and onnx_result.error is not None
    assert onnx_result.error.details["reason"] == "runtime_refused"
    assert onnx_result.error.details["verified_range"] == {"args[0]": {"0": [3, 3]}}
    assert [w.details["target"] for w in report.warnings if w.code == "target_failed"] == ["onnx"]
