"""Deployment targets on the real-model suite: every upload in bench/model_suite/ exported
with `torchport export FILE --target onnx --target aoti --target executorch` (sandboxed,
as a worker runs it), one fresh process per model; prints per model and target whether
the artifact was produced and verified, with its convert time and largest error.

    python bench/targets_suite.py [--only hf_bert,hf_gpt2] [--timeout 900] [--json FILE]

Models whose libraries do not import here (timm and torchvision where PyPI's torchvision
does not load on the CPU torch) are listed as skipped.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "bench" / "model_suite"
TARGETS = ("onnx", "aoti", "executorch")


def _requires(path: Path) -> list[str]:
    """The top-level packages the upload imports (its `import` statements)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return sorted(found - {"torch", "__future__"})


def _importable(name: str) -> bool:
    probe = subprocess.run(
        [sys.executable, "-c", f"import {name}"], capture_output=True, timeout=300, check=False
    )
    return probe.returncode == 0


def _worst(verification: dict[str, Any] | None) -> float | None:
    if not verification:
        return None
    errors = [
        output["max_abs_error"]
        for sample in verification.get("samples", [])
        for output in sample.get("outputs", [])
        if output.get("max_abs_error") is not None
    ]
    return max(errors) if errors else None


def run_one(path: Path, timeout: float) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(prefix=f"targets-{path.stem}-"))
    command = [sys.executable, "-m", "torchport.cli", "export", str(path), "--out", str(out)]
    for target in TARGETS:
        command += ["--target", target]
    started = time.perf_counter()
    try:
        subprocess.run(command, capture_output=True, timeout=timeout, check=False, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"model": path.stem, "status": "timeout", "wall_s": timeout}
    row: dict[str, Any] = {"model": path.stem, "wall_s": time.perf_counter() - started}
    report_path = out / "report.json"
    if not report_path.exists():
        row["status"] = "no report"
        return row
    report = json.loads(report_path.read_text())
    row["status"] = report["status"]
    row["error"] = (report.get("error") or {}).get("code")
    for name, result in (report.get("targets") or {}).items():
        verification = result.get("verification")
        row[name] = {
            "status": result["status"],
            "verified": bool(verification and verification.get("passed")),
            "convert_s": result.get("duration_s"),
            "max_abs_error": _worst(verification),
            "error": ((result.get("error") or {}).get("message") or "")[:300],
        }
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated model names")
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    paths = sorted(SUITE.glob("*.py"))
    if args.only:
        wanted = set(args.only.split(","))
        paths = [p for p in paths if p.stem in wanted]
    importable: dict[str, bool] = {}
    rows = []
    for path in paths:
        missing = [
            name
            for name in _requires(path)
            if not importable.setdefault(name, importlib.util.find_spec(name) is not None)
            or not importable.setdefault(f"import:{name}", _importable(name))
        ]
        row = {"model": path.stem, "status": "skipped", "missing": missing}
        if not missing:
            row = run_one(path, args.timeout)
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    exported = [r for r in rows if r["status"] == "succeeded"]
    print("| model | program.pt2 | onnx | aoti | executorch |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        cells = []
        for target in TARGETS:
            result = row.get(target)
            if not result:
                cells.append("-")
            elif result["status"] == "succeeded" and result["verified"]:
                error = result["max_abs_error"]
                cells.append(
                    f"✓ {result['convert_s']:.1f} s"
                    + (f", {error:.1e}" if error is not None else "")
                )
            else:
                cells.append(f"✗ {result['status']}")
        print(f"| {row['model']} | {row['status']} | " + " | ".join(cells) + " |")
    for target in TARGETS:
        ok = sum(
            1
            for r in exported
            if r.get(target, {}).get("status") == "succeeded" and r[target]["verified"]
        )
        print(f"{target}: {ok}/{len(exported)} of the exported models verified")
    return 0


if __name__ == "__main__":
    sys.exit(main())
