"""The result page's artifacts card (report.profile): one table of artifacts, the best
deployable choice first, an accuracy column only for a quantized job, and the chart of
latency against size. Jobs are seeded as in test_targets.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import Server
from tests.browser.test_targets import seed

pytestmark = pytest.mark.slow

THREADS = 4
SIZES = {"program": 300_000, "onnx": 120_000, "executorch": 20_000}
P50 = {  # name: (1 thread, 4 threads), ms
    "eager": (2.0, 0.8),
    "program": (3.0, 1.0),
    "onnx": (1.5, 1.2),
    "executorch": (0.9, 0.5),
}


def latency(threads: int, p50: float) -> dict[str, Any]:
    return {
        "threads": threads,
        "settings": {"torch.set_num_threads": threads},
        "load_s": 0.02,
        "warmup": 2,
        "runs": 20,
        "budget_reached": False,
        "p50_ms": p50,
        "p90_ms": p50 * 1.3,
        "mean_ms": p50 * 1.1,
        "min_ms": p50 * 0.9,
        "max_ms": p50 * 2,
    }


def profile() -> dict[str, Any]:
    files = {"program": "program.pt2", "onnx": "model.onnx", "executorch": "model.pte"}
    artifacts = []
    for name, (one, every) in P50.items():
        kind = name if name in ("eager", "program") else "target"
        artifacts.append(
            {
                "name": name,
                "kind": kind,
                "artifact": files.get(name),
                "files": [files[name]] if name in files else [],
                "size": SIZES.get(name),
                "runtime": "seeded",
                "load_s": None if kind == "eager" else 0.02,
                "peak_rss_mb": 500.0,
                "added_rss_mb": 0.0 if kind == "eager" else 8.0,
                "latency": [latency(1, one), latency(THREADS, every)],
            }
        )
    machine = {"cpu": "Seeded CPU", "architecture": "x86_64", "isa": ["avx2"], "threads": THREADS}
    return {
        "machine": machine,
        "runs": 20,
        "warmup": 2,
        "budget_s": 30,
        "duration_s": 2.5,
        "artifacts": artifacts,
    }


def table_rows(page: Any) -> list[list[str]]:
    card = page.locator("[data-card=artifacts]")
    card.wait_for()
    return card.locator("table.artifacts tbody tr").evaluate_all(
        "rows => rows.map(r => [r.dataset.profile, r.dataset.rank,"
        " r.querySelector('[data-field=verified]').dataset.verdict])"
    )


def test_the_artifacts_table_and_chart(page: Any, server: Server, tmp_path: Path) -> None:
    job_id, report = seed(server, tmp_path, failed=False, profile=profile())
    page.goto(f"/#/jobs/{job_id}")
    # executorch is verified; onnx failed a sample and the seeded program has no
    # verification: those two by p50 at 4 threads; the eager reference last.
    assert table_rows(page) == [
        ["executorch", "0", "verified"],
        ["program", "1", "not verified"],
        ["onnx", "2", "failed"],
        ["eager", "3", "reference"],
    ]
    card = page.locator("[data-card=artifacts]")
    headers = card.locator("table.artifacts th").all_text_contents()
    assert f"p50 {THREADS} threads" in headers and "p50 1 thread" in headers
    assert not any("accuracy" in header for header in headers)
    best = card.locator("tr[data-profile=executorch]")
    assert best.get_attribute("class") == "best"
    assert best.locator("[data-field=p50-1]").text_content() == "0.900 ms"
    assert best.locator("[data-field=p50-all]").text_content() == "0.500 ms"
    size = page.evaluate(
        "async (n) => (await import('./web/dom.js')).formatBytes(n)", SIZES["executorch"]
    )
    assert best.locator("[data-field=size]").text_content() == size
    assert card.locator("tr[data-profile=eager] [data-field=size]").text_content() == "—"
    assert card.locator("[data-order]").count() == 1  # the page says how it sorts

    chart = card.locator("svg[data-chart=latency-size]")
    points = chart.locator("circle[data-point]").evaluate_all(
        "cs => cs.map(c => [c.dataset.point, Number(c.dataset.threads), Number(c.dataset.p50),"
        " Number(c.getAttribute('cx')), Number(c.getAttribute('cy'))])"
    )
    # Every artifact with a size, at 4 threads and at 1; eager (no file) is the dashed line.
    assert sorted((name, threads, p50) for name, threads, p50, _, _ in points) == sorted(
        (name, threads, p50)
        for name in SIZES
        for threads, p50 in ((1, P50[name][0]), (THREADS, P50[name][1]))
    )
    at_all = {name: (cx, cy) for name, threads, _, cx, cy in points if threads == THREADS}
    by_size = sorted(SIZES, key=SIZES.__getitem__)
    assert sorted(at_all, key=lambda n: at_all[n][0]) == by_size  # x grows with size
    by_speed = sorted(SIZES, key=lambda n: P50[n][1])
    assert sorted(at_all, key=lambda n: -at_all[n][1]) == by_speed  # lower is faster
    assert chart.locator("[data-reference=eager]").count() == 1
    assert report["profile"]["machine"]["threads"] == THREADS


def test_a_quantized_job_shows_accuracy_vs_float(page: Any, server: Server, tmp_path: Path) -> None:
    quantization = {  # by target name; the lowest cosine over the outputs is shown
        "scheme": "int8",
        "calibration_source": "upload",
        "calibration_samples": 5,
        "targets": {
            "executorch": {
                "measured": True,
                "passed": True,
                "outputs": [{"path": "[0]", "cosine": 0.9993}, {"path": "[1]", "cosine": 0.9987}],
            },
            "onnx": {
                "measured": True,
                "passed": False,
                "outputs": [{"path": "[0]", "cosine": 0.91}],
            },
        },
    }
    job_id, _ = seed(
        server, tmp_path, failed=False, profile=profile(), unchecked={"quantization": quantization}
    )
    page.goto(f"/#/jobs/{job_id}")
    table_rows(page)
    card = page.locator("[data-card=artifacts]")
    assert "accuracy vs float" in card.locator("table.artifacts th").all_text_contents()
    accuracy = card.locator("table.artifacts tbody tr").evaluate_all(
        "rows => rows.map(r => { const c = r.querySelector('[data-field=accuracy]');"
        " return [r.dataset.profile, c.textContent, c.dataset.passed || ''] })"
    )
    assert accuracy == [
        ["executorch", "cosine 0.9987", "true"],
        ["program", "—", ""],
        ["onnx", "cosine 0.9100", "false"],
        ["eager", "—", ""],
    ]
    # Where int8 took its activation ranges from: the job's calibration file, 5 samples.
    calibration = card.locator("[data-calibration]")
    assert calibration.get_attribute("data-calibration") == "upload"
    assert calibration.get_attribute("data-samples") == "5"


def test_an_unprofiled_job_has_no_artifacts_card(page: Any, server: Server, tmp_path: Path) -> None:
    job_id, _ = seed(server, tmp_path, failed=False)
    page.goto(f"/#/jobs/{job_id}")
    page.locator("[data-card=deployment-targets]").wait_for()
    assert page.locator("[data-card=artifacts]").count() == 0
