"""Real-model suite: every upload in bench/model_suite/ exported two ways.

1. Plain torch, the way a person writes it by hand, in a fresh process per model:
   `torch.export.export` → `run_decompositions()` → `torch.export.save`; then a second
   fresh process that imports only torch loads the program, runs it on the saved example
   inputs and compares with the eager outputs.
2. torchport: `torchport export FILE --out DIR` (sandboxed unless --no-sandbox), read back
   from DIR/report.json.

Writes docs/models.md (unless --no-doc) and prints the table.

    python bench/model_suite.py [--only hf_bert,hf_gpt2] [--limit N] [--no-sandbox]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.metadata
import json
import logging
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "model_suite"
DOC = ROOT / "docs" / "models.md"
STAGES = ["export", "decompose", "save", "load", "run", "match"]
ATOL = RTOL = 1e-4
TIMEOUT_S = 900
LIBRARIES = ["torch", "transformers", "diffusers", "timm", "torchvision"]


@dataclass
class Row:
    """One model's results, both ways."""

    name: str
    requires: list[str]
    skipped: str | None = None
    plain_stage: str = "-"
    plain_error: str | None = None
    plain_max_error: float | None = None
    plain_inner_s: float | None = None
    plain_wall_s: float | None = None
    tp_status: str = "-"
    tp_ok: bool = False
    tp_error: str | None = None
    tp_warnings: list[str] = field(default_factory=list)
    tp_max_error: float | None = None
    tp_roundtrip: str | None = None
    tp_wall_s: float | None = None

    @property
    def library(self) -> str:
        return self.requires[0] if self.requires else "torch"

    @property
    def ratio(self) -> float | None:
        """torchport wall / the wall time of plain torch's fresh export process (start,
        imports, export + decompose + save), where plain torch saved a program and
        torchport exported, verified and round-tripped one."""
        if self.plain_stage not in STAGES[STAGES.index("save") :] or not self.tp_ok:
            return None
        assert self.plain_wall_s and self.tp_wall_s
        return self.tp_wall_s / self.plain_wall_s


def requires(path: Path) -> list[str]:
    """The file's `REQUIRES = [...]`, read without importing it."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "REQUIRES" for t in node.targets
        ):
            return list(ast.literal_eval(node.value))
    return []


def import_error(library: str) -> str | None:
    """None if `import library` works in a fresh interpreter, else its last error line."""
    done = subprocess.run(
        [sys.executable, "-c", f"import {library}"], capture_output=True, text=True
    )
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines()
    return lines[-1] if lines else f"exit code {done.returncode}"


# -- plain torch, child processes ---------------------------------------------------------


def child_export(model_file: str, work: str) -> None:
    """Fresh process 1: eager run, export, decompose, save; results in work/export.json."""
    import importlib.util

    import torch
    import torch.utils._pytree as pytree

    result: dict[str, Any] = {"stage": None}
    out = Path(work)
    try:
        spec = importlib.util.spec_from_file_location("suite_model", model_file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        args = module.example_args
        kwargs = getattr(module, "example_kwargs", None) or {}
        with torch.no_grad():
            eager = module.model(*args, **kwargs)
        torch.save({"args": args, "kwargs": kwargs}, out / "inputs.pt")
        torch.save(pytree.tree_leaves(eager), out / "eager.pt")
        started = time.perf_counter()
        ep = torch.export.export(
            module.model,
            args,
            kwargs,
            dynamic_shapes=getattr(module, "dynamic_shapes", None),
        )
        result["stage"] = "export"
        ep = ep.run_decompositions()
        result["stage"] = "decompose"
        torch.export.save(ep, out / "program.pt2")
        result["stage"] = "save"
        result["seconds"] = time.perf_counter() - started
    except BaseException as exc:
        result["error"] = describe(exc)
    (out / "export.json").write_text(json.dumps(result))


def child_load(work: str) -> None:
    """Fresh process 2, torch only: load, run on the saved inputs, compare with eager."""
    import torch
    import torch.utils._pytree as pytree

    out = Path(work)
    result: dict[str, Any] = {"stage": "save"}
    logged = _LastError()
    logging.getLogger("torch.export").addHandler(logged)
    try:
        program = torch.export.load(out / "program.pt2").module()
        result["stage"] = "load"
        inputs = torch.load(out / "inputs.pt")
        with torch.no_grad():
            actual = pytree.tree_leaves(program(*inputs["args"], **inputs["kwargs"]))
        result["stage"] = "run"
        expected = torch.load(out / "eager.pt")
        result["max_abs_error"], mismatch = compare(expected, actual)
        if mismatch is None:
            result["stage"] = "match"
        else:
            result["error"] = mismatch
        others = [lib for lib in LIBRARIES[1:] if lib in sys.modules]
        if others:
            result["error"] = f"the loader imported {others}"
    except BaseException as exc:  # torch.export.load logs the cause, raises a generic error
        result["error"] = (
            logged.error if result["stage"] == "save" and logged.error else describe(exc)
        )
    (out / "load.json").write_text(json.dumps(result))


class _LastError(logging.Handler):
    """The last exception torch logged (with its traceback)."""

    def __init__(self) -> None:
        super().__init__()
        self.error: str | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info and record.exc_info[1] is not None:
            self.error = describe(record.exc_info[1])


def compare(expected: list[Any], actual: list[Any]) -> tuple[float, str | None]:
    """Max abs error over float leaves, and why the outputs differ (None if they match)."""
    import torch

    if len(expected) != len(actual):
        return float("nan"), f"{len(actual)} outputs, eager had {len(expected)}"
    worst, reason = 0.0, None
    for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
        if not isinstance(e, torch.Tensor):
            if e != a:
                reason = reason or f"output {i}: {a!r} != {e!r}"
            continue
        if not isinstance(a, torch.Tensor) or a.shape != e.shape:
            reason = reason or f"output {i}: {getattr(a, 'shape', a)} != {tuple(e.shape)}"
            continue
        if e.numel() == 0:
            continue
        worst = max(worst, (a.double() - e.double()).abs().max().item())
        if not torch.allclose(a, e, atol=ATOL, rtol=RTOL, equal_nan=True):
            reason = reason or f"output {i} differs by more than atol={ATOL}, rtol={RTOL}"
    return worst, reason


def describe(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0][:300] if lines else ''}"


# -- the parent --------------------------------------------------------------------------


def run_plain(path: Path, row: Row) -> None:
    with tempfile.TemporaryDirectory(prefix="suite-plain-") as work:
        for step in (["_export", str(path), work], ["_load", work]):
            started = time.perf_counter()
            done = subprocess.run(
                [sys.executable, __file__, *step], capture_output=True, text=True, timeout=TIMEOUT_S
            )
            if step[0] == "_export":  # the process the ratio compares with
                row.plain_wall_s = time.perf_counter() - started
            name = "export.json" if step[0] == "_export" else "load.json"
            result_file = Path(work) / name
            if not result_file.exists():
                tail = done.stderr.strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
                row.plain_error = f"{step[0][1:]} process died: {tail[0][:300]}"
                break
            result = json.loads(result_file.read_text())
            row.plain_stage = result["stage"] or "-"
            row.plain_error = result.get("error")
            row.plain_max_error = result.get("max_abs_error", row.plain_max_error)
            row.plain_inner_s = result.get("seconds", row.plain_inner_s)
            if row.plain_stage != "save" or row.plain_error:
                break


def run_torchport(path: Path, row: Row, sandbox: bool) -> None:
    with tempfile.TemporaryDirectory(prefix="suite-torchport-") as out:
        command = [sys.executable, "-m", "torchport.cli", "export", str(path), "--out", out]
        if not sandbox:
            command.append("--no-sandbox")
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
        row.tp_wall_s = time.perf_counter() - started
        report_file = Path(out) / "report.json"
        if not report_file.exists():
            tail = done.stderr.strip().splitlines()[-1:] or [""]
            row.tp_status = f"no report (exit {done.returncode})"
            row.tp_error = tail[0][:300]
            return
        report = json.loads(report_file.read_text())
    row.tp_status = report["status"]
    if report.get("error"):
        row.tp_status += f" ({report['error']['code']})"
        row.tp_error = f"{report['error']['code']}: {report['error']['message'][:300]}"
    row.tp_warnings = sorted({w["code"] for w in report.get("warnings", [])})
    verification = report.get("verification") or {}
    errors = [
        o["max_abs_error"]
        for s in verification.get("samples", [])
        for o in s.get("outputs", [])
        if o.get("max_abs_error") is not None
    ]
    row.tp_max_error = max(errors) if errors else None
    row.tp_roundtrip = (verification.get("roundtrip") or {}).get("status")
    row.tp_ok = (
        report["status"] == "succeeded"
        and verification.get("passed") is True
        and row.tp_roundtrip == "passed"
    )
    if report["status"] == "succeeded" and not row.tp_ok:
        roundtrip = verification.get("roundtrip") or {}
        row.tp_error = f"verification passed={verification.get('passed')}, " + (
            f"round trip {row.tp_roundtrip}: {roundtrip.get('reason')}"
        )


# -- output ------------------------------------------------------------------------------


def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(rows: list[Row]) -> str:
    head = [
        "model",
        "library",
        "plain torch got to",
        "torchport",
        "warnings",
        "max abs error",
        "plain s (export / wall)",
        "torchport s",
        "ratio",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r.skipped:
            cells = [r.name, r.library, r.skipped, "-", "-", "-", "-", "-", "-"]
        else:
            errors = f"{fmt(r.plain_max_error, '.1e')} / {fmt(r.tp_max_error, '.1e')}"
            plain_s = f"{fmt(r.plain_inner_s, '.1f')} / {fmt(r.plain_wall_s, '.1f')}"
            tp = r.tp_status + ("" if r.tp_ok or r.tp_status != "succeeded" else " (unverified)")
            cells = [
                r.name,
                r.library,
                r.plain_stage,
                tp,
                ", ".join(r.tp_warnings) or "-",
                errors,
                plain_s,
                fmt(r.tp_wall_s, ".1f"),
                fmt(r.ratio, ".2f"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(rows: list[Row], sandbox: bool) -> str:
    ran = [r for r in rows if not r.skipped]
    ok = sum(r.tp_ok for r in ran)
    plain_ok = sum(r.plain_stage == "match" for r in ran)
    ratios = [r.ratio for r in ran if r.ratio is not None]
    skipped = len(rows) - len(ran)
    where = "through the sandbox" if sandbox else "WITHOUT the sandbox (--no-sandbox)"
    median = f"{statistics.median(ratios):.2f}" if ratios else "-"
    return (
        f"**{ok}/{len(ran)} exported, verified and loadable torch-only {where}** "
        f"(plain torch: {plain_ok}/{len(ran)} matched eager after a torch-only load; "
        f"{skipped} models not run, excluded). Median per-model time ratio torchport CLI / "
        f"plain torch: {median} (over the {len(ratios)} models where plain torch saved a "
        "program and torchport passed)."
    )


def failures(rows: list[Row]) -> str:
    lines = []
    for r in rows:
        if r.skipped:
            continue
        if r.plain_error:
            lines.append(f"- `{r.name}` plain torch, after `{r.plain_stage}`: {r.plain_error}")
        if r.tp_error:
            lines.append(f"- `{r.name}` torchport: {r.tp_error}")
    return "\n".join(line.replace("|", "\\|") for line in lines) or "None."


def versions() -> str:
    found = []
    for lib in LIBRARIES:
        try:
            found.append(f"{lib} {importlib.metadata.version(lib)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{lib} (not installed)")
    return ", ".join(found)


DOC_TEMPLATE = """# Real-model suite

A yardstick: {count} real model architectures from transformers, diffusers, timm and
torchvision, each one upload file in `bench/model_suite/` built from a tiny config with
random weights (no downloads), exported two ways:

- **plain torch**, what a person writes by hand: `torch.export.export` →
  `run_decompositions()` → `torch.export.save` in a fresh process, then a second fresh
  process that imports only torch loads the program, runs it on the saved example inputs
  and compares with the eager outputs (atol = rtol = {atol});
- **torchport**: `torchport export FILE --out DIR` {mode}, read back from `report.json`.

## How to run

    python bench/model_suite.py                       # all, writes this file
    python bench/model_suite.py --only hf_bert,hf_t5  # a selection
    python bench/model_suite.py --limit 5 --no-doc    # the first five, table on stdout

A selection of the transformers/diffusers files runs in CI through the sandboxed engine:
`pytest -m slow tests/models_suite`.

## Columns

- **plain torch got to**: the last stage plain torch got through: `export`, `decompose`,
  `save`, `load` (torch-only process), `run`, `match` (outputs equal eager within
  tolerance); `-` if export failed. Failures are listed below the table.
- **torchport**: `report.json`'s status (and error code); "(unverified)" when it succeeded
  but verification or the torch-only round trip did not pass.
- **warnings**: the codes of `report.json`'s warnings.
- **max abs error**: plain torch (loaded program vs eager) / torchport (largest over its
  verification samples, exported vs eager).
- **plain s**: seconds of export + decompose + save measured inside the process / wall
  seconds of that fresh process (interpreter start, imports, the model's construction,
  one eager run for the comparison, export + decompose + save). The torch-only load
  runs in a second process, not counted.
- **torchport s**: wall seconds of the whole `torchport export` command (sandbox start,
  export, decomposition, verification on several samples, the torch-only round trip).
- **ratio**: torchport s / plain wall s (the issue's yardstick: the CLI against plain
  torch's export + decompose + save in a fresh process), for models where plain torch
  saved a program and torchport's export was verified and round-tripped.

## Environment

Measured with `{command}` at commit {commit}, on {machine}: Python {python}, {versions}.
Wall times are indicative: the machine may be shared with other work while the suite runs.

{skipped}

## Results

{summary}

{table}

### Failures

{failures}
"""


KEPT = "<!-- measured by hand, kept when the suite rewrites this file -->"
"""What follows this line in docs/models.md is not the suite's: a run keeps it."""


def _kept_tail() -> str:
    text = DOC.read_text() if DOC.exists() else ""
    return text[text.index(KEPT) :] if KEPT in text else ""


def write_doc(rows: list[Row], sandbox: bool, command: str, broken: dict[str, str]) -> str:
    if broken:
        skipped = "Libraries that do not load here, so their models were not run: " + "; ".join(
            f"{lib} (`{error}`)" for lib, error in sorted(broken.items())
        )
        names = [r.name for r in rows if r.skipped]
        skipped += f". Not run: {', '.join(f'`{n}`' for n in names)}."
    else:
        skipped = "Every required library loaded."
    return DOC_TEMPLATE.format(
        count=len(rows),
        atol=ATOL,
        mode="(sandboxed, the default)" if sandbox else "with `--no-sandbox`",
        command=command,
        commit=_commit(),
        machine=f"{platform.machine()} Linux, {_cpus()} CPUs",
        python=platform.python_version(),
        versions=versions(),
        skipped=skipped,
        summary=summary(rows, sandbox),
        table=table(rows),
        failures=failures(rows),
    ) + ("\n" + tail if (tail := _kept_tail()) else "")


def _commit() -> str:
    """The checkout's commit, and whether the tree had uncommitted changes."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    changes = " (uncommitted changes in the tree)" if dirty.stdout.strip() else ""
    return (head.stdout.strip() or "unknown") + changes


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated file names (without .py)")
    parser.add_argument("--limit", type=int, help="run only the first N files")
    parser.add_argument("--no-sandbox", action="store_true", help="torchport --no-sandbox")
    parser.add_argument("--no-doc", action="store_true", help="do not write docs/models.md")
    parser.add_argument("--doc", type=Path, default=DOC, help="where to write the doc")
    parser.add_argument("--json", type=Path, help="also write every row's fields to this file")
    args = parser.parse_args()

    files = sorted(SUITE.glob("*.py"))
    if args.only:
        wanted = set(args.only.split(","))
        files = [f for f in files if f.stem in wanted]
    if args.limit:
        files = files[: args.limit]
    needed = sorted({lib for f in files for lib in requires(f)})
    broken = {lib: e for lib in needed if (e := import_error(lib)) is not None}

    rows = []
    for path in files:
        row = Row(path.stem, requires(path))
        missing = [lib for lib in row.requires if lib in broken]
        if missing:
            row.skipped = f"not run: {', '.join(missing)} does not load here"
        else:
            run_plain(path, row)
            run_torchport(path, row, sandbox=not args.no_sandbox)
        print(f"{row.name}: plain {row.plain_stage}, torchport {row.tp_status}", flush=True)
        rows.append(row)
        if args.json:
            args.json.write_text(json.dumps([dataclasses.asdict(r) for r in rows], indent=1))

    print()
    print(table(rows))
    print()
    print(summary(rows, sandbox=not args.no_sandbox))
    if not args.no_doc:
        command = "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]])
        args.doc.write_text(write_doc(rows, not args.no_sandbox, command, broken))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "_export":
        child_export(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "_load":
        child_load(sys.argv[2])
    else:
        raise SystemExit(main())
