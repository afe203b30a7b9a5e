"""Checkpoint uploads end to end: `torchport export DIR --task …` (sandboxed, as a worker
runs it) against the same work done by hand with plain torch and transformers, in a
fresh process each, on checkpoints written here with random weights.

    python bench/hf_checkpoints.py checkpoints [--targets onnx,aoti,executorch]
    python bench/hf_checkpoints.py real-size  [--only llama-250m,vit-86m,llama-1b,llama-3b]
        [--torchport-only]
        [--runs N]

`checkpoints`: tiny Llama, Qwen3 and Qwen3-MoE checkpoints with `task: text-generation`
(whether the program and each target generate eager transformers' tokens), BERT and ViT
checkpoints with no task given (the task inferred; each target's verdict), and T5 and
Whisper with no task given (encoder-decoder, two programs, generation checked).
`--only t5,whisper` runs some rows of either suite.
`real-size`: a ~250M-parameter Llama (generation-ready, static cache of 1024 tokens),
ViT-base (86M, image-classification), and Llama-3.2-1B- and -3B-shaped bfloat16
checkpoints (1.24B and 3.2B parameters, `bench/real_checkpoints.py`), each exported with no
option but the task; torchport's stage times and peak memory against a
cold plain-torch script doing load → export (transformers' static-cache recipe for the
LLM) → run_decompositions → save → load → run; torchport's peak resident memory per stage
(`report.stages[].peak_rss_mb`, the job process's) beside the job tree's peak. Prints
markdown tables (docs/models.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from real_checkpoints import LLAMA_245M  # noqa: E402  (a script beside this one)

STAGES = ("loading", "tracing", "decomposing", "verifying", "serializing", "converting")

TINY: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"num_key_value_heads": 2},
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"num_key_value_heads": 2, "head_dim": 8}),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {
            "num_key_value_heads": 2,
            "head_dim": 8,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
        },
    ),
}
OTHER: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert": (
        "BertConfig",
        "BertForMaskedLM",
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 96,
            "max_position_embeddings": 64,
        },
    ),
    "vit": (
        "ViTConfig",
        "ViTForImageClassification",
        {
            "hidden_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "image_size": 32,
            "patch_size": 8,
            "num_labels": 5,
        },
    ),
}
"""Checkpoints exported with no task given: the task is inferred from the architecture."""

SEQ2SEQ: dict[str, tuple[str, str, dict[str, Any]]] = {
    "t5": (
        "T5Config",
        "T5ForConditionalGeneration",
        {
            "vocab_size": 96,
            "d_model": 32,
            "d_kv": 8,
            "d_ff": 64,
            "num_layers": 2,
            "num_heads": 4,
            "decoder_start_token_id": 0,
            "pad_token_id": 0,
            "eos_token_id": 1,
            "n_positions": 64,
        },
    ),
    "whisper": (
        "WhisperConfig",
        "WhisperForConditionalGeneration",
        {
            "vocab_size": 96,
            "d_model": 32,
            "encoder_layers": 2,
            "decoder_layers": 2,
            "encoder_attention_heads": 4,
            "decoder_attention_heads": 4,
            "encoder_ffn_dim": 64,
            "decoder_ffn_dim": 64,
            "num_mel_bins": 16,
            "max_source_positions": 24,
            "max_target_positions": 48,
            "decoder_start_token_id": 1,
            "pad_token_id": 0,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "suppress_tokens": None,
            "begin_suppress_tokens": None,
        },
    ),
}
"""Encoder-decoder checkpoints, no task given: two programs, generation-ready. Their
weights are redrawn wide (`_save(widen=True)`, as tests/engine/test_seq2seq.py does): at
the default init a tiny random decoder repeats one token and its check would prove
nothing."""
TINY_COMMON = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "initializer_range": 0.2,  # a context-dependent model: see tests/engine/test_generation.py
}
REAL: dict[str, tuple[str, str, dict[str, Any], str]] = {
    "llama-250m": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {**LLAMA_245M, "max_position_embeddings": 2048},
        "text-generation",
    ),
    "vit-86m": ("ViTConfig", "ViTForImageClassification", {}, "image-classification"),
    # bfloat16 at real size, written by bench/real_checkpoints.py (random draws, sharded)
    "llama-1b": ("", "llama-1b", {}, "text-generation"),
    "llama-3b": ("", "llama-3b", {}, "text-generation"),
}

PLAIN = r"""
import json, resource, sys, time
t = {"start": time.perf_counter()}
import torch, transformers
directory, task, out = sys.argv[1], sys.argv[2], sys.argv[3]
mark = lambda k: t.__setitem__(k, time.perf_counter())
if task == "text-generation":
    from transformers.integrations.executorch import TorchExportableModuleForDecoderOnlyLM
    model = transformers.AutoModelForCausalLM.from_pretrained(directory).eval()
    model.generation_config.cache_implementation = "static"
    module = TorchExportableModuleForDecoderOnlyLM(model, batch_size=1, max_cache_len=1024).model
    kwargs = {"input_ids": torch.randint(0, 32000, (1, 16)), "cache_position": torch.arange(16)}
    seq = torch.export.Dim("sequence_length", min=1, max=1024)
    shapes = {"input_ids": {1: seq}, "cache_position": {0: seq}}
    strict = True
else:
    module = transformers.AutoModelForImageClassification.from_pretrained(directory).eval()
    kwargs = {"pixel_values": torch.randn(2, 3, 224, 224)}
    shapes = {"pixel_values": {0: torch.export.Dim("batch_size", min=1, max=64)}}
    strict = False
mark("loading")
ep = torch.export.export(module, (), kwargs, dynamic_shapes=shapes, strict=strict)
mark("tracing")
ep = ep.run_decompositions()
mark("decomposing")
torch.export.save(ep, out)
mark("saving")
loaded = torch.export.load(out)
with torch.no_grad():
    loaded.module()(**kwargs)
mark("load_and_run")
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"times": t, "peak_mb": peak}))
"""


def _save(
    directory: Path,
    config_class: str,
    model_class: str,
    config: dict[str, Any],
    *,
    widen: bool = False,
) -> int:
    import torch
    import transformers

    torch.manual_seed(0)
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**config))
    if widen:
        sys.path.insert(0, str(ROOT))
        from tests.engine.test_seq2seq import widen as redraw

        redraw(model)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def _torchport(
    directory: Path, task: str | None, out: Path, targets: list[str], timeout: float
) -> Any:
    cli = str(Path(sys.executable).parent / "torchport")
    command = [cli, "export", str(directory)] + (["--task", task] if task else [])
    command += [arg for name in targets for arg in ("--target", name)]
    command += ["--out", str(out), "--json"]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    wall = time.perf_counter() - started
    report_path = out / "report.json"
    if not report_path.is_file():
        raise SystemExit(f"torchport wrote no report: {done.stderr[-2000:]}")
    return json.loads(report_path.read_text()), wall


def _matched(check: dict[str, Any] | None) -> str:
    if not check:
        return "-"
    if check["matched"]:
        return "matched"
    if check["first_mismatch"] is not None:
        return f"differs at {check['first_mismatch']}"
    # the first run matched; a later one (started again at position 0) did not
    run = next((r for r in check.get("runs", []) if not r["matched"]), {})
    return f"differs at {run.get('first_mismatch')} after a restart ({run.get('prompt')} prompt)"


def _cell(result: dict[str, Any]) -> str:
    status = result["status"]
    if status == "failed" and result.get("error"):
        status = f"failed ({result['error'].get('code')})"
        print(f"  {result['error'].get('message')}", file=sys.stderr)
    if result.get("generation"):
        return f"{status}, {_matched(result['generation'])}"
    verdict = (result.get("verification") or {}).get("verdict")
    return f"{status}, {verdict}" if verdict else status


def checkpoints(targets: list[str], timeout: float, only: list[str] | None = None) -> None:
    print(
        "| checkpoint | parameters | task (source) | program | "
        + " | ".join(targets)
        + " | torchport s |"
    )
    print("|---|---|---|---|" + "---|" * len(targets) + "---|")
    rows: list[tuple[str, str, str, dict[str, Any], str | None]] = [
        (n, c, m, {**TINY_COMMON, **e}, "text-generation") for n, (c, m, e) in TINY.items()
    ]
    rows += [(n, c, m, e, None) for n, (c, m, e) in OTHER.items()]
    rows += [(n, c, m, e, None) for n, (c, m, e) in SEQ2SEQ.items()]
    for name, config_class, model_class, config, task in rows:
        if only and name not in only:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / name
            count = _save(directory, config_class, model_class, config, widen=name in SEQ2SEQ)
            report, wall = _torchport(directory, task, Path(tmp) / "out", targets, timeout)
        checkpoint = report.get("checkpoint") or {}
        chosen = f"{checkpoint.get('task')} ({checkpoint.get('task_source')})"
        if report["status"] != "succeeded":
            program = f"failed: {report['error']['code']}"
        elif report.get("generation"):
            program = "generation " + _matched(report["generation"].get("check"))
        else:
            program = (report.get("verification") or {}).get("verdict", "-")
        cells = [_cell(report["targets"].get(n, {"status": "-"})) for n in targets]
        print(
            f"| {name} | {count:,} | {chosen} | {program} | "
            + " | ".join(cells)
            + f" | {wall:.0f} |"
        )


def _plain(directory: Path, task: str, out: Path, timeout: float) -> tuple[str, float, float]:
    """The cold plain-torch script: its stage times, wall seconds and peak MB."""
    started = time.perf_counter()
    plain = subprocess.run(
        [sys.executable, "-c", PLAIN, str(directory), task, str(out)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=True,
    )
    wall = time.perf_counter() - started
    facts = json.loads(plain.stdout.strip().splitlines()[-1])
    times = facts["times"]
    order = ["start", "loading", "tracing", "decomposing", "saving", "load_and_run"]
    stages = " / ".join(f"{times[b] - times[a]:.1f}" for a, b in itertools.pairwise(order))
    return stages, wall, facts["peak_mb"]


def real_size(
    only: list[str] | None, timeout: float, plain_too: bool = True, runs: int = 1
) -> None:
    """Per model, `runs` alternated pairs (plain script, then torchport); the row is the
    pair with the median ratio, and every pair's walls and ratio are printed after the
    table (one run of a 30-60 s job moves by 10% on this machine)."""
    print(
        "| model | parameters | task | torchport stages s (load / trace / decompose / verify "
        "/ serialize) | torchport stage peaks MB (same order) | torchport wall s | torchport "
        "peak MB | plain stages s (load / export / decompose / save / load+run) | plain wall s "
        "| plain peak MB | wall ratio |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    timed: list[str] = []
    for name, (config_class, model_class, config, task) in REAL.items():
        if only and name not in only:
            continue
        pairs: list[tuple[float, str, float | None, float | None, Any, float]] = []
        with tempfile.TemporaryDirectory() as tmp:
            directory = Path(tmp) / name
            if config_class:
                count = _save(directory, config_class, model_class, config)
            else:  # a real-size bfloat16 checkpoint, drawn straight into its shards
                from real_checkpoints import write

                count = write(model_class, directory)
            for run in range(runs):
                plain_stages, plain_wall, plain_peak = "-", None, None
                if plain_too:
                    plain_stages, plain_wall, plain_peak = _plain(
                        directory, task, Path(tmp) / "plain.pt2", timeout
                    )
                out = Path(tmp) / f"out-{run}"
                report, wall = _torchport(directory, task, out, [], timeout)
                ratio = wall / plain_wall if plain_wall else 0.0
                pairs.append((ratio, plain_stages, plain_wall, plain_peak, report, wall))
        if runs > 1:
            timed.append(
                f"{name}: {runs} alternated pairs, torchport / plain wall s: "
                + "; ".join(f"{p[5]:.1f} / {p[2] or 0:.1f} = {p[0]:.2f}" for p in pairs)
                + f"; median ratio {statistics.median(p[0] for p in pairs):.2f}"
            )
        ratio, plain_stages, plain_wall, plain_peak, report, wall = sorted(
            pairs, key=lambda p: p[0]
        )[(len(pairs) - 1) // 2]
        stages = {s["name"]: s["duration_s"] for s in report["stages"]}
        ours = " / ".join(f"{stages.get(s, 0):.1f}" for s in STAGES[:5])
        peaks = {s["name"]: s.get("peak_rss_mb") for s in report["stages"]}
        ours_mb = " / ".join("-" if peaks.get(s) is None else f"{peaks[s]:.0f}" for s in STAGES[:5])
        memory = ((report.get("sandbox") or {}).get("details") or {}).get("memory") or {}
        print(
            f"| {name} | {count / 1e6:.0f}M | {task} | {ours} | {ours_mb} | {wall:.1f} | "
            f"{memory.get('peak_mb', '-')} | {plain_stages} | "
            + (
                f"{plain_wall:.1f} | {plain_peak:.0f} | {ratio:.2f} |"
                if plain_wall is not None and plain_peak is not None
                else "- | - | - |"
            )
        )
        if report["status"] != "succeeded":
            print(f"<!-- {name}: {report['error']} -->")
        trip = (report.get("verification") or {}).get("roundtrip") or {}
        if trip.get("save_s") is not None:  # where serializing went: the save may be early
            timed.append(
                f"{name} program: save {trip['save_s']:.1f} s (at the start of verifying when "
                f"early), the loader's load + run {trip.get('duration_s') or 0:.1f} s (beside "
                f"verification), serializing stage {stages.get('serializing', 0):.1f} s"
            )
        samples = (report.get("verification") or {}).get("samples") or []
        if samples:  # where the verifying stage went, per sample: eager / program seconds
            timed.append(
                f"{name} verification: "
                + "; ".join(
                    f"{s['label']} {s['input_shapes']} {s['eager_s'] or 0:.1f} / "
                    f"{s['exported_s'] or 0:.1f} s"
                    for s in samples
                )
            )
    for line in timed:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite", choices=["checkpoints", "real-size"])
    parser.add_argument("--targets", default="onnx,aoti,executorch")
    parser.add_argument("--only", default=None)
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument(
        "--torchport-only", action="store_true", help="real-size: skip the plain-torch script"
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="real-size: alternated pairs per model (median)"
    )
    args = parser.parse_args()
    if args.suite == "checkpoints":
        only = args.only.split(",") if args.only else None
        checkpoints([t for t in args.targets.split(",") if t], args.timeout, only)
    else:
        real_size(
            args.only.split(",") if args.only else None,
            args.timeout,
            not args.torchport_only,
            args.runs,
        )


if __name__ == "__main__":
    main()
