"""torchport's generation-ready LLM artifacts against the specialised exporters', on one
checkpoint, in one run, each pair timed in the same runtime on the same token ids.

    python bench/real_checkpoints.py llama-245m DIR     # 245M float32, 0.98 GB
    python bench/runtime_peers.py DIR --work WORK [--runtime onnx] [--runtime executorch]
        [--precision float] [--precision int4] [--peer-python PEER/bin/python]

Per runtime and precision, both converters run on the checkpoint:

- `onnx`: torchport's `torchport export DIR --task text-generation --target onnx` (int4:
  `--quantize 8da4w`, MatMulNBits computing in int8, as the builder's CPU int4 does)
  against ONNX Runtime GenAI's model builder, `python -m onnxruntime_genai.models.builder
  -i DIR -o OUT -p fp32|int4 -e cpu` (from the onnxruntime-genai torchport's `targets`
  extra installs; it needs a tokenizer: a small byte-level BPE one is written beside the
  checkpoint when there is none, and the timing feeds token ids, so its vocabulary does
  not matter). Both timed by onnxruntime-genai's `Generator` on the folder.
- `executorch`: torchport's `--target executorch` (int4: `--quantize 8da4w`) against
  optimum-executorch's `main_export(..., recipe="xnnpack", use_custom_sdpa=True,
  use_custom_kv_cache=True, max_seq_len=1024, qlinear="8da4w")`, run by `--peer-python`,
  an environment of its own (optimum-executorch 1.1.0 pins transformers 5.0.0rc1):
  `python3 -m venv PEER && PEER/bin/pip install torch==2.13.0 transformers==5.0.0rc1
  'optimum~=2.0.0' accelerate pandas parameterized coremltools omegaconf tiktoken kgb
  scikit-learn ruamel.yaml tabulate flatbuffers sentencepiece && PEER/bin/pip install
  --no-deps executorch==1.4.1 torchao==0.18.0 optimum-executorch==1.1.0
  pytorch-tokenizers`. Both timed by the ExecuTorch runtime's `forward`
  (`executorch.runtime`, with ExecuTorch's LLM custom ops loaded: both `.pte` files
  attend through `llama::custom_sdpa`).

torchport's `converting` is the job's converting stage, the one target's whole time
(`report.stages`: conversion, loading the artifact, verification and the generation
checks; `report.targets.<t>.duration_s`, conversion and loading only, is kept as
`convert_load_s`); a peer's is its wall time. Then,
alternating the two artifacts in each of `--repeats` rounds, each in a fresh process:
time to first token of a 16-token prompt (its prefill) and decode ms/token after prompts
of `--short` and `--long` tokens (the median of `--steps` one-token steps, the best
round). The machine's other load shifts both alike; only ratios within one run compare.
Prints a Markdown table and writes `WORK/runtime_peers.json`; `--reuse` times the
artifacts an earlier run left in WORK again instead of converting them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROMPT = 16
"""Length of the prompt whose prefill is timed."""
CHUNK = 128
"""ExecuTorch prefills a long prompt in chunks of this many tokens."""
SEED = 0
PEERS = {"onnx": "builder", "executorch": "optimum-executorch"}
"""Each runtime's peer, as the table names it."""
OPTIMUM = """
import sys, time
from optimum.exporters.executorch import main_export
source, out, precision, length = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
kwargs = dict(use_custom_sdpa=True, use_custom_kv_cache=True, max_seq_len=length)
if precision == "int4":
    kwargs["qlinear"] = "8da4w"
main_export(model_name_or_path=source, task="text-generation", recipe="xnnpack",
            output_dir=out, local_files_only=True, **kwargs)
"""


def ensure_tokenizer(checkpoint: Path) -> None:
    """A small byte-level BPE tokenizer beside the checkpoint, when it has none."""
    if (checkpoint / "tokenizer.json").exists() or (checkpoint / "tokenizer.model").exists():
        return
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(["Export a model once, run it anywhere."] * 4, trainer)
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe, bos_token="<s>", eos_token="</s>"
    )
    tokenizer.save_pretrained(checkpoint)


def model_mb(folder: Path) -> float:
    """The artifact's files: `*.onnx` with their external data, or `*.pte`."""
    files = [
        p
        for p in folder.iterdir()
        if p.suffix in (".onnx", ".pte") or p.name.endswith((".onnx.data", ".ptd"))
    ]
    return sum(p.stat().st_size for p in files) / 1e6


def _timed(command: list[str], what: str) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}): {done.stderr[-3000:]}")
    return time.perf_counter() - started


def torchport(
    checkpoint: Path, out: Path, runtime: str, precision: str, cache_len: int
) -> dict[str, Any]:
    """torchport's export of the checkpoint to `runtime`, in its sandbox."""
    shutil.rmtree(out, ignore_errors=True)
    options = {
        "timeout_s": 3600,
        "profile": {"enabled": False},
        "generation": {"max_cache_len": cache_len},
    }
    command = [
        sys.executable, "-m", "torchport.cli", "export", str(checkpoint),
        "--task", "text-generation", "--target", runtime, "--out", str(out), "--json",
        "--options", json.dumps(options),
    ]  # fmt: skip
    if precision == "int4":
        command += ["--quantize", "8da4w"]
    wall = _timed(command, "torchport")
    report = json.loads((out / "report.json").read_text())
    target = report["targets"][runtime]
    in_runtime = target.get("runtime_generation") or {}
    stages = {stage["name"]: stage["duration_s"] for stage in report["stages"]}
    return {
        "wall_s": wall,
        "converting_s": stages["converting"],  # the one target, its checks included
        "convert_load_s": target["duration_s"],
        "mb": model_mb(out),
        "generation_in_runtime": in_runtime.get("passed"),
    }


def peer(
    checkpoint: Path, out: Path, runtime: str, precision: str, cache_len: int, python: str
) -> dict[str, Any]:
    """The specialised exporter's artifact of the checkpoint, timed."""
    shutil.rmtree(out, ignore_errors=True)
    if runtime == "onnx":
        command = [
            sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(checkpoint),
            "-o", str(out), "-p", "fp32" if precision == "float" else "int4", "-e", "cpu",
            "-c", str(out.parent / "cache"),
        ]  # fmt: skip
    else:
        command = [python, "-c", OPTIMUM, str(checkpoint), str(out), precision, str(cache_len)]
    wall = _timed(command, f"the {runtime} peer")
    return {"wall_s": wall, "converting_s": wall, "mb": model_mb(out)}


def measure_onnx(folder: Path, short: int, long: int, steps: int) -> dict[str, float]:
    """Prefill ms of a `PROMPT`-token prompt and decode ms/token after `short` and `long`
    tokens, by onnxruntime-genai's `Generator` on `folder`."""
    import onnxruntime_genai as og

    model = og.Model(str(folder))
    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]

    def run(prompt: list[int], count: int) -> tuple[float, list[float]]:
        params = og.GeneratorParams(model)
        params.set_search_options(max_length=len(prompt) + count + 1, do_sample=False)
        generator = og.Generator(model, params)
        prefill = _ms(lambda: generator.append_tokens([prompt]))
        return prefill, [_ms(generator.generate_next_token) for _ in range(count)]

    return _positions(run, vocab, short, long, steps)


def measure_executorch(folder: Path, short: int, long: int, steps: int) -> dict[str, float]:
    """As `measure_onnx`, by the ExecuTorch runtime's `forward` on `folder/model.pte`
    (prompts over `CHUNK` tokens prefilled in chunks, the greedy pick included)."""
    import torch
    from executorch.extension.llm.custom_ops import custom_ops  # noqa: F401  (the LLM ops)
    from executorch.runtime import Runtime

    program = Runtime.get().load_program(str(folder / "model.pte"))
    vocab = int(program.load_method("get_vocab_size").execute([])[0])
    forward = program.load_method("forward")

    def step(ids: list[int], start: int) -> int:
        positions = torch.arange(start, start + len(ids))
        logits = forward.execute([torch.tensor([ids]), positions])[0]
        return int(logits[0, -1].argmax())

    def run(prompt: list[int], count: int) -> tuple[float, list[float]]:
        chunks = [prompt[i : i + CHUNK] for i in range(0, len(prompt), CHUNK)]
        found: list[int] = []
        prefill = _ms(lambda: found.extend(step(c, i * CHUNK) for i, c in enumerate(chunks)))
        times = []
        for position in range(len(prompt), len(prompt) + count):
            token = found[-1]
            times.append(_ms(lambda t=token, p=position: found.append(step([t], p))))
        return prefill, times

    return _positions(run, vocab, short, long, steps)


def _ms(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def _positions(
    run: Callable[[list[int], int], tuple[float, list[float]]],
    vocab: int,
    short: int,
    long: int,
    steps: int,
) -> dict[str, float]:
    import random

    draw = random.Random(SEED)
    found: dict[str, float] = {}
    found["prefill_ms"], _ = run([draw.randrange(3, vocab) for _ in range(PROMPT)], 0)
    for name, length in (("short", short), ("long", long)):
        _, times = run([draw.randrange(3, vocab) for _ in range(length)], steps)
        found[f"decode_{name}_ms"] = statistics.median(times)
    return found


def measured(runtime: str, folder: Path, short: int, long: int, steps: int) -> dict[str, float]:
    """`measure_<runtime>` in a fresh process."""
    code = (
        "import json, sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
        "import runtime_peers as r; measure = getattr(r, 'measure_' + sys.argv[2]); "
        "print(json.dumps(measure(Path(sys.argv[3]), *map(int, sys.argv[4:]))))"
    )
    given = [str(Path(__file__).parent), runtime, str(folder), str(short), str(long), str(steps)]
    done = subprocess.run([sys.executable, "-c", code, *given], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"timing {folder} failed: {done.stderr[-3000:]}")
    last: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return last


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("checkpoint", type=Path)
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--runtime", action="append", choices=["onnx", "executorch"])
    parser.add_argument("--precision", action="append", choices=["float", "int4"])
    parser.add_argument("--peer-python", default=sys.executable)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-len", type=int, default=1024)
    parser.add_argument("--short", type=int, default=64)
    parser.add_argument("--long", type=int, default=896)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument(
        "--reuse", action="store_true", help="keep the artifacts an earlier run converted"
    )
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    ensure_tokenizer(args.checkpoint)
    rows: list[dict[str, Any]] = []
    for runtime in args.runtime or ["onnx", "executorch"]:
        for precision in args.precision or ["float", "int4"]:
            made: dict[str, tuple[Path, dict[str, Any]]] = {}
            for name in ("torchport", "peer"):
                out = args.work / f"{runtime}-{precision}-{name}"
                kept = out / "conversion.json"
                if args.reuse and kept.exists():
                    made[name] = (out, json.loads(kept.read_text()))
                    continue
                if name == "torchport":
                    facts = torchport(args.checkpoint, out, runtime, precision, args.cache_len)
                else:
                    facts = peer(
                        args.checkpoint, out, runtime, precision, args.cache_len, args.peer_python
                    )
                kept.write_text(json.dumps(facts) + "\n")
                made[name] = (out, facts)
            timings: dict[str, list[dict[str, float]]] = {name: [] for name in made}
            for _ in range(args.repeats):
                for name, (folder, _facts) in made.items():
                    timings[name].append(
                        measured(runtime, folder, args.short, args.long, args.steps)
                    )
            for name, (_folder, facts) in made.items():
                best = {key: min(run[key] for run in timings[name]) for key in timings[name][0]}
                rows.append(
                    {"runtime": runtime, "converter": name, "precision": precision, **facts, **best}
                )
            (args.work / "runtime_peers.json").write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows, args.short, args.long))
    versions = ", ".join(f"{n} {_version(n)}" for n in ("onnxruntime-genai", "executorch"))
    print(f"\n{versions}; {os.cpu_count()} cores")


def table(rows: list[dict[str, Any]], short: int, long: int) -> str:
    """The rows as Markdown, each torchport row's decode against its peer's."""
    lines = [
        f"| runtime | converter | precision | converting s | MB | prefill {PROMPT} ms | "
        f"decode ms/token at {short} | at {long} | decode / peer's |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        other = next(
            r
            for r in rows
            if (r["runtime"], r["precision"]) == (row["runtime"], row["precision"])
            and r["converter"] == "peer"
        )
        ratios = "-"
        if row["converter"] == "torchport":
            ratios = (
                f"{row['decode_short_ms'] / other['decode_short_ms']:.2f} / "
                f"{row['decode_long_ms'] / other['decode_long_ms']:.2f}"
            )
        name = row["converter"] if row["converter"] == "torchport" else PEERS[row["runtime"]]
        lines.append(
            f"| {row['runtime']} | {name} | {row['precision']} | "
            f"{row['converting_s']:.0f} | {row['mb']:.0f} | {row['prefill_ms']:.0f} | "
            f"{row['decode_short_ms']:.1f} | {row['decode_long_ms']:.1f} | {ratios} |"
        )
    return "\n".join(lines)


def _version(name: str) -> str:
    from importlib.metadata import version

    return version(name)


if __name__ == "__main__":
    main()
