"""The graph view on a large graph (an 800-op transformer exported by the real server):
grouped by module, collapsed and readable at fit, a bounded page, groups that open on a
click, search before and after decomposition, details that are never cut; and a transformers
model's nodes pointing at the library's line (Chromium)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.browser.conftest import MODELS, Server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MAX_DOM_NODES = 1000
"""The whole result page's elements for this model: 653 now, 2,067 before the graph was
grouped and long tables built only in view (the issue's 800-op model: 2,563)."""
MAX_PAGE_HEIGHT = 6000
"""Pixels: 4,128 now, 9,812 before (the issue's model: 13,798)."""
READABLE_ZOOM = 0.65
"""graph_view.js READABLE_ZOOM: a 10 px label drawn at 6.5 px or more."""


@pytest.fixture(scope="module")
def large(server: Server) -> tuple[str, dict[str, Any], dict[str, Any]]:
    return server.export(MODELS / "graph_large.py")


def open_graph(page: Any, job_id: str) -> None:
    page.goto(f"/#/jobs/{job_id}")
    page.wait_for_selector("[data-card=graph]", timeout=120_000)
    page.wait_for_function("document.querySelector('.graph-host')?.graphView !== undefined")


def drawn(page: Any) -> dict[str, Any]:
    return page.evaluate(
        """() => {
          const cy = document.querySelector('.graph-host').cy;
          return Object.fromEntries(cy.nodes().map((n) => [n.id(), n.data('kind')]));
        }"""
    )


def click_node(page: Any, node_id: str) -> None:
    """A real mouse click on a drawn node (or group)."""
    page.locator("#graph-canvas").scroll_into_view_if_needed()
    page.wait_for_timeout(300)  # cytoscape re-reads the canvas position after a scroll
    point = page.evaluate(
        """(id) => {
          const host = document.querySelector('.graph-host');
          const node = host.cy.getElementById(id);
          host.cy.stop(true, true);
          host.cy.center(node);
          const box = host.querySelector('#graph-canvas').getBoundingClientRect();
          const p = node.renderedPosition();
          return {x: box.left + p.x, y: box.top + p.y};
        }""",
        node_id,
    )
    page.mouse.click(point["x"], point["y"])


def test_a_large_graph_opens_grouped_collapsed_and_readable(
    page: Any, large: tuple[str, dict[str, Any], dict[str, Any]]
) -> None:
    job_id, graph, _ = large
    nodes = graph["graph"]["nodes"]
    assert sum(n["op"] == "call_function" for n in nodes) >= 800
    open_graph(page, job_id)
    shown = drawn(page)
    # The top level: the input, three modules (collapsed), the ops between them, the output.
    assert shown == {
        "tokens": "input",
        "m:embed": "group",
        "m:encoder": "group",
        "m:head": "group",
        "mean": "op",
        "output": "output",
    }
    stats = page.evaluate(
        """() => {
          const host = document.querySelector('.graph-host');
          const canvas = host.querySelector('#graph-canvas');
          const box = host.cy.elements().renderedBoundingBox();
          return {
            zoom: host.cy.zoom(),
            inside: box.x1 >= 0 && box.y1 >= 0 && box.x2 <= canvas.clientWidth
              && box.y2 <= canvas.clientHeight,
            canvasElements: canvas.getElementsByTagName('*').length,
            dom: document.getElementsByTagName('*').length,
            height: document.documentElement.scrollHeight,
          };
        }"""
    )
    assert stats["zoom"] >= READABLE_ZOOM and stats["inside"], stats  # readable at fit
    assert stats["canvasElements"] < 10, stats  # a few canvas layers, no element per node
    assert stats["dom"] <= MAX_DOM_NODES, stats
    assert stats["height"] <= MAX_PAGE_HEIGHT, stats
    # The signature's 190+ parameters are listed in a box that builds only the rows in view.
    table = page.locator("[data-card=signature] .long-table")
    state = [n for n in nodes if n["op"] == "placeholder" and n["name"] != "tokens"]
    assert table.get_attribute("data-rows") == str(len(state))
    assert table.locator("tbody tr:not(.spacer)").count() < 40
    table.evaluate("(box) => { box.scrollTop = box.scrollHeight; }")
    last = state[-1]["name"]
    page.wait_for_selector(f"[data-card=signature] .long-table tr td code:text-is('{last}')")


def test_a_click_opens_a_group_and_collapse_closes_it(
    page: Any, large: tuple[str, dict[str, Any], dict[str, Any]]
) -> None:
    open_graph(page, large[0])
    click_node(page, "m:encoder")
    page.wait_for_selector("#node-details [data-group=encoder]")
    shown = drawn(page)
    assert shown["m:encoder"] == "module"  # an open frame now
    layers = [f"m:encoder.layers.{i}" for i in range(14)]
    assert all(shown[layer] == "group" for layer in layers)
    assert len(shown) == 6 + 14 + 1  # the layers and the final norm joined the drawing
    click_node(page, "m:encoder.layers.3")
    page.wait_for_selector("#node-details [data-group='encoder.layers.3']")
    shown = drawn(page)
    assert shown["m:encoder.layers.3"] == "module"
    assert {"m:encoder.layers.3.attn", "m:encoder.layers.3.mlp"} <= set(shown)
    assert shown["m:encoder.layers.4"] == "group"
    assert page.evaluate("document.querySelector('.graph-host').cy.zoom()") >= READABLE_ZOOM
    page.click("#node-details [data-action=collapse]")
    shown = drawn(page)
    assert shown["m:encoder.layers.3"] == "group"
    assert "m:encoder.layers.3.attn" not in shown
    page.click("#collapse-all")
    assert set(drawn(page)) == {"tokens", "m:embed", "m:encoder", "m:head", "mean", "output"}


def test_search_finds_ops_in_collapsed_groups_and_ops_decomposition_removed(
    page: Any, large: tuple[str, dict[str, Any], dict[str, Any]]
) -> None:
    job_id, graph, report = large
    nodes = graph["graph"]["nodes"]
    open_graph(page, job_id)

    addmm = [n["name"] for n in nodes if n["target"] == "aten.addmm.default"]
    page.fill("#graph-search", "addmm")
    page.press("#graph-search", "Enter")
    assert page.get_attribute("#graph-search-status", "data-matches") == str(len(addmm))
    first = page.get_attribute("#node-details [data-node]", "data-node")
    assert first == addmm[0]
    assert drawn(page)[first] == "op"  # the groups around it were opened
    page.press("#graph-search", "Enter")
    assert page.get_attribute("#node-details [data-node]", "data-node") == addmm[1]
    assert page.locator("#graph-search-results [data-node]").count() == 8  # at most 8 listed
    assert page.locator("#graph-search-decomposed li").count() == 0

    # linear is no node any more: decomposition took it away, and the search says into what.
    decomposition = report["decomposition"]
    assert "aten.linear.default" in decomposition["removed_ops"]
    came = [n for n in nodes if n.get("decomposed_from") == "aten.linear.default"]
    page.fill("#graph-search", "linear")
    page.press("#graph-search", "Enter")
    item = page.locator("#graph-search-decomposed li[data-op='aten.linear.default']")
    assert item.get_attribute("data-before") == str(
        decomposition["ops_before"]["aten.linear.default"]
    )
    assert item.get_attribute("data-removed") == "true"
    assert item.get_attribute("data-into") == ",".join(sorted({n["target"] for n in came}))
    assert item.get_attribute("data-nodes") == str(len(came))
    assert page.get_attribute("#graph-search-status", "data-matches") == str(len(came))
    shown = page.get_attribute("#node-details [data-node]", "data-node")
    assert shown == came[0]["name"]
    decomposed = page.text_content("#node-details [data-field=decomposed-from] td")
    assert decomposed == "aten.linear.default"

    page.fill("#graph-search", "no-such-op")
    page.press("#graph-search", "Enter")
    assert page.get_attribute("#graph-search-status", "data-matches") == "0"


def test_node_details_are_whole_and_unclipped(
    page: Any, large: tuple[str, dict[str, Any], dict[str, Any]]
) -> None:
    job_id, graph, _ = large
    open_graph(page, job_id)
    # The node with the longest arguments (they were cut at 400 characters before).
    longest = max(graph["graph"]["nodes"], key=lambda n: len(str(n["args"])))
    page.fill("#graph-search", longest["name"])
    page.press("#graph-search", "Enter")
    page.wait_for_selector(f"#node-details [data-node='{longest['name']}']")
    clipped = page.evaluate(
        """() => {
          const panel = document.querySelector('#node-details');
          const cut = [...panel.querySelectorAll('*')].filter((e) =>
            e.scrollWidth > e.clientWidth + 1 && getComputedStyle(e).overflowX !== 'visible');
          return {
            cut: cut.map((e) => e.tagName + '.' + e.className),
            vertical: panel.scrollHeight > panel.clientHeight + 1,
            wider: panel.scrollWidth > panel.clientWidth + 1,
            args: panel.querySelector('[data-field=args] pre').textContent,
          };
        }"""
    )
    assert clipped["cut"] == [] and not clipped["vertical"] and not clipped["wider"], clipped
    assert "…" not in clipped["args"]
    module = page.text_content("#node-details [data-field=module] td")
    frames = longest["module_stack"]
    assert module is not None and all(f["path"] in module for f in frames)
    # Its inputs are links to the nodes they name.
    sources = page.locator("#node-details [data-field=inputs] [data-goto]").all_text_contents()
    assert sources and all(name in {n["name"] for n in graph["graph"]["nodes"]} for name in sources)


def test_library_nodes_show_the_librarys_line(page: Any, server: Server) -> None:
    job_id, graph, _ = server.export(ROOT / "tests" / "models" / "hf_llama.py")
    library = [n for n in graph["graph"]["nodes"] if n.get("library_source")]
    assert library and all(n["source"] is None for n in library)
    node = next(n for n in library if n["target"] == "aten.mm.default")
    where = node["library_source"]
    assert where["file"] == "transformers/models/llama/modeling_llama.py"
    open_graph(page, job_id)
    page.fill("#graph-search", node["name"])
    page.press("#graph-search", "Enter")
    page.wait_for_selector(f"#node-details [data-node='{node['name']}']")
    row = page.locator("#node-details [data-field=source]")
    assert row.get_attribute("data-library") == "true"
    assert row.locator("td code").first.text_content() == f"{where['file']}:{where['line']}"
    assert row.locator(".badge.library").count() == 1
    assert row.locator("pre").text_content() == where["code"]
