"""The Grafana dashboard of deploy/grafana: a dashboard Grafana's own models read whole
(grafana-foundation-sdk), whose every query parses as PromQL (promql-parser) and asks only
for metrics the service's `/metrics` serves, and which shows every metric docs/service.md
documents."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
from grafana_foundation_sdk.cog import runtime as cogruntime
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard, Panel, RowPanel
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import embedded_client

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "torchport-dashboard.json"
VARIABLES = {"$__rate_interval": "5m", "$__range": "6h", "$queue": "cpu"}
"""Grafana's variables in the queries, as Grafana fills them in before Prometheus sees them."""
SAMPLE_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}
_LABEL_VALUES = re.compile(r"label_values\(\s*(?P<metric>[a-zA-Z_:][\w:]*)")


def _dashboard() -> dict[str, Any]:
    return dict(json.loads(DASHBOARD.read_text()))


def _panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _panels(panel.get("panels", []))


def _queries(dashboard: dict[str, Any]) -> list[str]:
    return [
        target["expr"]
        for panel in _panels(dashboard["panels"])
        for target in panel.get("targets", [])
    ]


def _metrics_of(expr: str) -> set[str]:
    for variable, value in VARIABLES.items():
        expr = expr.replace(variable, value)
    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector) and node.name:
            found.add(node.name)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """Every sample name `/metrics` of the service can carry (by each family's type)."""
    clients = embedded_client(tmp_path_factory.mktemp("grafana"))
    client = next(clients)
    try:
        text = client.get("/metrics").text
    finally:
        clients.close()
    names = set()
    for family in text_string_to_metric_families(text):
        suffixes = SAMPLE_SUFFIXES.get(family.type, ("",))
        names |= {family.name + suffix for suffix in suffixes}
    return names


def _kept(ours: Any, theirs: Any, path: str) -> list[str]:
    """Where Grafana's model lost or changed what the file says (an unknown key, a wrong
    type); empty when the round trip keeps all of it."""
    if isinstance(ours, dict):
        if not isinstance(theirs, dict):
            return [path]
        return [
            lost
            for key, value in ours.items()
            for lost in (
                _kept(value, theirs[key], f"{path}.{key}") if key in theirs else [f"{path}.{key}"]
            )
        ]
    if isinstance(ours, list):
        if not isinstance(theirs, list) or len(ours) != len(theirs):
            return [path]
        return [
            lost
            for i, (a, b) in enumerate(zip(ours, theirs, strict=True))
            for lost in _kept(a, b, f"{path}[{i}]")
        ]
    return [] if ours == theirs else [path]


def test_grafanas_models_read_the_whole_dashboard() -> None:
    register_default_plugins()
    data = _dashboard()
    model = Dashboard.from_json(data)
    rebuilt = json.loads(json.dumps(model.to_json(), cls=JSONEncoder))
    assert _kept(data, rebuilt, "dashboard") == []
    assert model.uid and model.title and model.schema_version >= 39
    panels = [p for p in model.panels or [] if isinstance(p, Panel)]
    rows = [p for p in model.panels or [] if isinstance(p, RowPanel)]
    assert panels and rows
    for panel in panels:
        # a panel type Grafana ships, each query a Prometheus one
        assert cogruntime.panelcfg_config(panel.type_val) is not None, panel.type_val
        assert panel.targets and all(
            type(target).__module__.endswith(".prometheus") for target in panel.targets
        ), panel.title


def test_the_panels_have_unique_ids_and_fit_the_grid() -> None:
    panels = list(_panels(_dashboard()["panels"]))
    ids = [panel["id"] for panel in panels]
    assert len(ids) == len(set(ids))
    for panel in panels:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["w"] > 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        refs = [target["refId"] for target in panel.get("targets", [])]
        assert len(refs) == len(set(refs)), panel["title"]


def test_every_query_is_promql_over_metrics_the_service_serves(served: set[str]) -> None:
    dashboard = _dashboard()
    queried = set().union(*(_metrics_of(expr) for expr in _queries(dashboard)))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            match = _LABEL_VALUES.search(variable["query"]["query"])
            assert match is not None, variable["name"]
            queried.add(match["metric"])
    assert queried  # the queries were read
    assert queried - served == set()


def test_every_documented_metric_is_on_the_dashboard() -> None:
    documented = re.findall(
        r"^\| `(torchport_\w+)` \|", (ROOT / "docs" / "service.md").read_text(), re.MULTILINE
    )
    queried = set().union(*(_metrics_of(expr) for expr in _queries(_dashboard())))
    shown = {
        name
        for name in documented
        if name in queried
        or any(name + s in queried for s in ("_total", "_bucket", "_count", "_sum"))
        or (name.endswith("_total") and name in queried)
    }
    assert len(documented) >= 11
    assert set(documented) - shown == set()
