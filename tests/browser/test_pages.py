"""The pages end to end in real Chromium against a real `torchport serve`."""

from __future__ import annotations

import hashlib
import json
import re
import time
import zipfile
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.browser.conftest import MAX_MODEL_BYTES, MODELS, ROOT, Server

pytestmark = pytest.mark.slow

SHARED_BATCH = {"image": {"0": {"name": "batch", "min": 1, "max": 64}}, "text": {"0": "batch"}}
EXPORTDB = "https://pytorch.org/docs/main/generated/exportdb/index.html#"


def job_id_of(page: Any) -> str:
    page.wait_for_url(re.compile(r"#/jobs/[^/]+$"))
    return str(page.url.rsplit("/", 1)[1])


def submit(page: Any, model: Path, dynamic_shapes: Any = None) -> str:
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(model))
    if dynamic_shapes is not None:
        page.fill("#dynamic-shapes", json.dumps(dynamic_shapes))
        assert page.get_attribute("#dynamic-shapes-status [data-valid]", "data-valid") == "true"
    page.click("#submit")
    return job_id_of(page)


def test_shared_batch_exports_and_the_graph_finds_a_node(page: Any, server: Server) -> None:
    job_id = submit(page, MODELS / "shared_batch.py", SHARED_BATCH)
    page.wait_for_selector("[data-card=summary]", timeout=120_000)
    for stage in ("loading", "tracing", "decomposing", "verifying", "serializing"):
        assert page.get_attribute(f"[data-stage={stage}]", "data-state") == "done"

    # Both inputs carry the same symbol for dim 0, in the declared range.
    shapes = page.locator(
        "[data-card=signature] tr[data-kind=user_input] td.shape"
    ).all_text_contents()
    symbols = {shape.strip("[]").split(",")[0] for shape in shapes}
    assert len(shapes) == 2 and len(symbols) == 1
    (symbol,) = symbols
    assert symbol == "batch"  # the declared name, not torch's s43
    sizes = page.locator("[data-card=verification] tr[data-sample=max] td").nth(1).text_content()
    assert sizes == "batch=64"
    # The export-again editor shows the example's sizes, not the symbol.
    editor = page.locator("[data-card=dynamic-shapes] .dim-editor tbody td").all_text_contents()
    assert "[2, 4]" in editor and "[2, 6]" in editor and "batch" not in editor
    ranges = page.locator(f"[data-card=summary] li[data-symbol='{symbol}']").text_content()
    assert ranges is not None and "[1, 64]" in ranges
    assert page.locator("[data-card=verification] .verdict.fail").count() == 0
    assert page.locator("[data-card=verification] .verdict.pass").count() >= 4

    # Search a node: both Linear layers became addmm.
    page.wait_for_function("document.querySelector('.graph-host')?.cy !== undefined")
    page.fill("#graph-search", "addmm")
    page.press("#graph-search", "Enter")
    assert page.get_attribute("#graph-search-status", "data-matches") == "2"
    assert page.text_content("#node-details [data-node]") in ("addmm", "addmm_1")
    shape = page.text_content("#node-details [data-field=shape] td")
    assert shape is not None and shape.startswith(f"[{symbol},")

    # Click a node on the canvas: its source line and module path show.
    page.fill("#graph-search", "")
    page.locator("#graph-canvas").scroll_into_view_if_needed()
    page.wait_for_timeout(300)  # cytoscape re-reads the canvas position after a scroll
    point = page.evaluate(
        """() => {
          const host = document.querySelector('.graph-host');
          const node = host.cy.getElementById('relu');
          host.cy.stop(true, true);
          host.cy.center(node);
          const box = host.querySelector('#graph-canvas').getBoundingClientRect();
          const p = node.renderedPosition();
          return {x: box.left + p.x, y: box.top + p.y};
        }"""
    )
    page.mouse.click(point["x"], point["y"])
    page.wait_for_selector("#node-details [data-node=relu]")
    source = page.text_content("#node-details [data-field=source] td")
    graph = server.api(f"v1/exports/{job_id}/artifacts/graph.json")
    relu_node = next(n for n in graph["graph"]["nodes"] if n["name"] == "relu")
    where = relu_node["source"]
    assert where["file"] == "shared_batch.py" and "self.left(image)" in where["code"]
    assert source == f"{where['file']}:{where['line']}{where['code']}"
    module = page.text_content("#node-details [data-field=module] td")
    assert module is not None and "left.1" in module and "ReLU" in module

    # program.pt2 downloads and is the stored artifact.
    job = server.api(f"v1/exports/{job_id}")
    with page.expect_download() as download_info:
        page.click("[data-artifact='program.pt2']")
    path = download_info.value.path()
    sha = next(a["sha256"] for a in job["artifacts"] if a["name"] == "program.pt2")
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == sha
    assert zipfile.is_zipfile(path)

    # The Model Explorer graph has every node of graph.json, and edges only between them.
    with page.expect_download() as download_info:
        page.click("[data-artifact='model-explorer.json']")
    explorer = json.loads(Path(download_info.value.path()).read_text())
    main = explorer["graphs"][0]
    ids = [node["id"] for node in main["nodes"]]
    assert ids == [node["name"] for node in graph["graph"]["nodes"]]
    edges = [edge for node in main["nodes"] for edge in node["incomingEdges"]]
    assert edges and all(edge["sourceNodeId"] in ids for edge in edges)
    relu = next(node for node in main["nodes"] if node["id"] == "relu")
    assert relu["namespace"] == "left/1"
    assert {"sourceNodeId": "addmm", "sourceNodeOutputId": "0", "targetNodeInputId": "0"} in relu[
        "incomingEdges"
    ]


def test_a_failing_model_shows_its_code_hint_and_line(page: Any, server: Server) -> None:
    job_id = submit(page, MODELS / "data_dependent.py")
    page.wait_for_selector("#error-code", timeout=120_000)
    assert page.get_attribute("#error-code", "data-code") == "data_dependent"
    report = server.api(f"v1/exports/{job_id}/artifacts/report.json")
    assert page.text_content("#error-hint") == "How to fix it: " + report["error"]["hint"].replace(
        "`", ""
    )
    highlighted = page.locator("#source .src-line.highlight")
    assert highlighted.count() == 1
    assert highlighted.get_attribute("data-line") == "9"
    assert "if y.sum() > 0:" in (highlighted.text_content() or "")
    # Lines around it come from the file this tab uploaded.
    assert page.locator("#source .src-line").count() > 5
    assert page.get_attribute("[data-stage=tracing]", "data-state") == "failed"
    links = page.locator("a[data-case]")
    assert links.count() == len(report["error"]["exportdb"]) > 0
    for i in range(links.count()):
        case = links.nth(i).get_attribute("data-case")
        assert links.nth(i).get_attribute("href") == EXPORTDB + str(case).replace("_", "-")
    assert page.locator("tr[data-type=data_dependent]").count() >= 1


def source_rows(page: Any) -> list[tuple[int, str]]:
    """(line number, text) of each line the failure page shows."""
    rows = page.locator("#source .src-line").evaluate_all(
        "lines => lines.map(l => [Number(l.dataset.line), l.querySelector('.code').textContent])"
    )
    return [(int(n), str(text)) for n, text in rows]


def test_the_failure_page_opened_later_shows_the_source_from_the_api(
    page: Any, server: Server, browser: Any
) -> None:
    job_id = submit(page, MODELS / "data_dependent.py")
    page.wait_for_selector("#error-code", timeout=120_000)
    fresh = browser.new_context(base_url=server.url).new_page()
    try:
        fresh.goto(f"/#/jobs/{job_id}")
        fresh.wait_for_selector("#source[data-source=upload]")
        highlighted = fresh.locator("#source .src-line.highlight")
        assert highlighted.count() == 1
        assert highlighted.get_attribute("data-line") == "9"
        lines = (MODELS / "data_dependent.py").read_text().split("\n")
        # Six lines either side of line 9, as in the uploaded file.
        assert source_rows(fresh) == [(n, lines[n - 1]) for n in range(3, 16)]
    finally:
        fresh.context.close()


def test_the_failing_file_inside_a_zip_is_shown_from_the_api(
    page: Any, server: Server, browser: Any, tmp_path: Path
) -> None:
    net = (MODELS / "data_dependent.py").read_text()
    archive = tmp_path / "gate_pkg.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("gate/__init__.py", "")
        zf.writestr("gate/net.py", "# the package's model\n\n" + net)
    page.goto("/")
    page.set_input_files("[data-testid=file-model]", str(archive))
    page.fill("input[name=entry]", "gate/net.py")
    page.click("#submit")
    job_id = job_id_of(page)
    page.wait_for_selector("#error-code", timeout=120_000)
    report = server.api(f"v1/exports/{job_id}/artifacts/report.json")
    assert report["error"]["location"]["file"] == "gate/net.py"
    assert report["error"]["location"]["line"] == 11

    fresh = browser.new_context(base_url=server.url).new_page()
    try:
        fresh.goto(f"/#/jobs/{job_id}")
        fresh.wait_for_selector("#source[data-source=upload]")
        assert fresh.locator("#source .src-line.highlight").get_attribute("data-line") == "11"
        lines = ("# the package's model\n\n" + net).split("\n")
        assert source_rows(fresh) == [(n, lines[n - 1]) for n in range(5, 18)]
    finally:
        fresh.context.close()


def test_a_failed_job_offers_the_dimension_editor_from_its_inputs(
    page: Any, server: Server, browser: Any
) -> None:
    job_id = submit(page, MODELS / "data_dependent.py")
    page.wait_for_selector("#error-code", timeout=120_000)
    report = server.api(f"v1/exports/{job_id}/artifacts/report.json")
    assert [(i["path"], i["name"], i["shape"]) for i in report["inputs"]] == [("args[0]", "x", [3])]
    # A page that did not upload the model: the editor comes from report.json's inputs,
    # and "export again" brings the uploaded file back from the API.
    fresh = browser.new_context(base_url=server.url).new_page()
    try:
        fresh.goto(f"/#/jobs/{job_id}")
        fresh.wait_for_selector("[data-card=dynamic-shapes] input[data-dim='x.0']")
        assert fresh.locator("[data-card=dynamic-shapes] input[data-dim]").count() == 1
        fresh.check("input[data-dim='x.0']")
        fresh.fill("[data-card=dynamic-shapes] .dim-name", "n")
        fresh.fill("[data-card=dynamic-shapes] .dim-min", "2")
        fresh.fill("[data-card=dynamic-shapes] .dim-max", "16")
        spec = {"x": {"0": {"name": "n", "min": 2, "max": 16}}}
        assert json.loads(fresh.text_content("#reexport-spec") or "null") == spec
        fresh.click("#reexport")
        fresh.wait_for_selector("#upload-form")
        assert json.loads(fresh.input_value("#dynamic-shapes")) == spec
        assert fresh.text_content("[data-zone=model] .file-name") == "data_dependent.py"
        fresh.click("#submit")
        again = job_id_of(fresh)
        assert again != job_id
        job = server.api(f"v1/exports/{again}")
        assert job["options"]["dynamic_shapes"] == spec
        assert job["model_name"] == "data_dependent.py"
        uploaded = httpx.get(f"{server.url}v1/exports/{again}/uploads/model", timeout=10)
        assert uploaded.content == (MODELS / "data_dependent.py").read_bytes()
    finally:
        fresh.context.close()


def test_cancel_stops_a_running_job(page: Any, server: Server, tmp_path: Path) -> None:
    slow = tmp_path / "slow_60.py"
    slow.write_bytes((ROOT / "tests" / "models" / "service_slow.py").read_bytes())
    job_id = submit(page, slow)
    page.wait_for_selector("[data-stage=loading][data-state=running]", timeout=60_000)
    page.click("#cancel")
    page.wait_for_selector(".job-header [data-status=canceled]", timeout=30_000)
    assert page.is_hidden("#cancel")
    assert page.get_attribute("[data-card=canceled] [data-code]", "data-code") == "canceled"
    assert server.api(f"v1/exports/{job_id}")["status"] == "canceled"


def test_the_form_refuses_bad_input_before_submitting(
    page: Any, server: Server, tmp_path: Path
) -> None:
    before = len(server.api("v1/exports?limit=100")["items"])
    page.goto("/")
    page.click("#submit")
    assert page.locator("#form-errors li[data-field=model]").get_attribute("data-code") == (
        "invalid_request"
    )

    wrong = tmp_path / "notes.txt"
    wrong.write_text("not a model")
    page.set_input_files("[data-testid=file-model]", str(wrong))
    page.click("#submit")
    assert page.locator("#form-errors li[data-field=model]").get_attribute("data-code") == (
        "invalid_request"
    )

    big = tmp_path / "big.py"
    big.write_text("# padding\n" * (MAX_MODEL_BYTES // 10 + 10))
    page.set_input_files("[data-testid=file-model]", str(big))
    page.fill("#dynamic-shapes", '{"x": {"0": "batch"}')
    assert page.locator("#dynamic-shapes-status [data-code]").count() == 1
    page.fill("#dynamic-shapes", '{"x": {"0": "batch"}}')
    undeclared = page.locator("#dynamic-shapes-status [data-code]")
    assert undeclared.count() == 1 and "batch" in (undeclared.text_content() or "")
    page.click("#submit")
    codes = page.locator("#form-errors li").evaluate_all(
        "items => items.map(i => [i.dataset.field, i.dataset.code])"
    )
    assert ["model", "upload_too_large"] in codes
    assert ["dynamic_shapes", "invalid_request"] in codes
    assert len(server.api("v1/exports?limit=100")["items"]) == before


def test_the_jobs_list_filters_by_status(page: Any, server: Server) -> None:
    submit(page, MODELS / "data_dependent.py")
    page.wait_for_selector("#error-code", timeout=120_000)
    page.goto("/#/jobs")
    page.wait_for_selector("#jobs-table")
    page.select_option("#status-filter", "failed")
    page.wait_for_url(re.compile(r"status=failed"))
    page.wait_for_selector("#jobs-table")
    statuses = page.locator("#jobs-table tr[data-job]").evaluate_all(
        "rows => rows.map(r => r.dataset.status)"
    )
    failed = server.api("v1/exports?status=failed&limit=20")["items"]
    assert statuses == ["failed"] * len(failed) and statuses
    names = page.locator("#jobs-table tr[data-job] td[data-field=model_name]").all_text_contents()
    assert names == [job["model_name"] for job in failed]
    assert names[0] == "data_dependent.py"
    page.click("#jobs-table tr[data-job] a")
    page.wait_for_selector("#error-code")
    assert page.get_attribute("#error-code", "data-code") == failed[0]["error"]["code"]


def test_the_dynamic_shapes_grammar_and_fixes_in_the_browser(page: Any) -> None:
    page.goto("/")
    checked = page.evaluate(
        """async () => {
          const m = await import('./web/dynamic_shapes.js');
          const texts = [
            '{"x": {"0": {"name": "b", "min": 1, "max": 8}}, "y": {"0": "b", "1": "2*b+1"}}',
            '"auto"',
            '{"x": {"0": "b"}}',
            '{"x": {"0": {"name": "b", "min": 9, "max": 2}}}',
            '{"x": {"0": "b c"}}',
            '{"x": [null, 3.5]}',
            '{"x": ',
          ];
          return texts.map((t) => m.checkDynamicShapes(t).errors.length);
        }"""
    )
    assert checked == [0, 0, 1, 1, 1, 1, 1]
    fixed = page.evaluate(
        """async () => {
          const m = await import('./web/dynamic_shapes.js');
          return [
            m.applySuggestedFixes(
              {x: {"0": {name: "dx", min: 3, max: 6}}, y: {"0": {name: "dy"}}},
              ["dy = Dim('dy', max=5)", "dx = dy + 1"]),
            m.applySuggestedFixes({x: {"0": {name: "n"}}}, ["n = 4"]),
            m.applySuggestedFixes(
              {x: {"0": {name: "a"}}, y: {"0": {name: "b"}}},
              ["_a = Dim('_a', min=1, max=8)", "a = 2*_a", "b = 2*_a + 1"]),
            m.applySuggestedFixes({x: {"0": {name: "n"}}}, ["something torch never prints"]),
          ];
        }"""
    )
    assert fixed[0] == {"x": {"0": "dy+1"}, "y": {"0": {"name": "dy", "max": 5}}}
    assert fixed[1] == {"x": {"0": 4}}
    assert fixed[2] == {
        "x": {"0": {"name": "_a", "min": 1, "max": 8, "expr": "2*_a"}},
        "y": {"0": "2*_a+1"},
    }
    assert fixed[3] is None


def test_the_bodies_of_cond_expand_in_the_graph(page: Any, server: Server) -> None:
    job_id = submit(page, ROOT / "tests" / "models" / "doc_nested.py")
    page.wait_for_selector("[data-card=graph]", timeout=120_000)
    page.wait_for_function("document.querySelector('.graph-host')?.cy !== undefined")
    graph = server.api(f"v1/exports/{job_id}/artifacts/graph.json")
    bodies = graph["graph"]["subgraphs"]
    assert set(bodies) == {"true_graph_0", "false_graph_0"}
    # Drawn nodes, not the frames of the module groups around them.
    count = (
        "document.querySelector('.graph-host').cy.nodes().filter((n) => !n.data('group')).length"
    )
    before = page.evaluate(count)
    assert before == len(graph["graph"]["nodes"])
    page.fill("#graph-search", "higher_order.cond")
    page.press("#graph-search", "Enter")
    page.wait_for_selector("#node-details [data-node=cond]")
    page.click("#node-details [data-subgraph=true_graph_0]")
    # The body's nodes and one box around them join the graph.
    assert page.evaluate(count) == before + len(bodies["true_graph_0"]["nodes"]) + 1
    button = "#node-details [data-subgraph=true_graph_0]"
    assert page.get_attribute(button, "data-expanded") == "true"
    page.click("#node-details [data-subgraph=true_graph_0]")
    assert page.evaluate(count) == before


def test_the_environment_page_shows_what_the_worker_recorded(page: Any, server: Server) -> None:
    # The worker describes its environment once started (the import checks take seconds).
    deadline = time.monotonic() + 240
    while not (workers := server.api("v1/environment")["workers"]):
        assert time.monotonic() < deadline, "no worker recorded its environment"
        time.sleep(1)
    [worker] = workers
    assert worker["queue"] == "cpu"
    torch = next(lib for lib in worker["environment"]["libraries"] if lib["name"] == "torch")
    assert torch["imports"] is True and torch["version"] == worker["environment"]["torch"]
    page.goto("/")
    page.click("#environment-link")
    page.wait_for_url(re.compile(r"#/environment$"))
    row = page.locator("table.libraries[data-queue=cpu] tr[data-library=torch]")
    row.wait_for()
    assert row.get_attribute("data-imports") == "true"
    assert row.locator("td[data-field=version]").text_content() == torch["version"]
