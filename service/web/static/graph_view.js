// The interactive graph: cytoscape with a dagre layout (vendored, see vendor.js). Pan and
// zoom, search a node, click for its details, expand the subgraphs of cond/map in place.
import { cytoscape } from "./vendor.js";
import { h, fill, formatShape } from "./dom.js";
import { subgraphsOf } from "./model_explorer.js";

const LARGE = 1500;

function shortTarget(node) {
  if (node.op !== "call_function") return node.op === "placeholder" ? node.name : node.op === "output" ? "output" : node.target;
  return node.target.replace(/^aten\./, "").replace(/\.default$/, "").replace(/^(torch\.ops\.)?higher_order\./, "");
}

function kindOf(node, subgraphs, nonCore) {
  if (node.op === "placeholder") return /^(p|b|c)_/.test(node.name) ? "state" : "input";
  if (node.op === "output") return "output";
  if (subgraphsOf(node, subgraphs).length) return "control";
  if (node.op === "get_attr") return "state";
  if (nonCore.has(node.target)) return "noncore";
  return "op";
}

function refs(value, found = []) {
  if (Array.isArray(value)) value.forEach((v) => refs(v, found));
  else if (value && typeof value === "object") {
    if (typeof value.node === "string" && Object.keys(value).length === 1) found.push(value.node);
    else Object.values(value).forEach((v) => refs(v, found));
  }
  return found;
}

/** Elements of `graph` with ids under `prefix`, inside compound `parent` when given. */
function elementsOf(graph, prefix, parent, nonCore, index) {
  const elements = [];
  const names = new Set(graph.nodes.map((n) => n.name));
  for (const node of graph.nodes) {
    const id = prefix + node.name;
    const shape = node.shape ? formatShape(node.shape) : node.outputs ? `${node.outputs.length} outputs` : "";
    index.set(id, { node, graph, prefix });
    const kind = kindOf(node, graph.subgraphs || {}, nonCore);
    elements.push({ group: "nodes", data: { id, label: shape ? `${shortTarget(node)}\n${shape}` : shortTarget(node), kind, name: node.name, target: node.target, ...(parent ? { parent } : {}) } });
    refs([node.args, node.kwargs]).forEach((source, i) => {
      if (names.has(source)) elements.push({ group: "edges", data: { id: `${id}<-${i}`, source: prefix + source, target: id } });
    });
  }
  return elements;
}

const STYLE = [
  { selector: "node", style: { shape: "round-rectangle", "background-color": "#e8eef9", "border-width": 1, "border-color": "#8aa1c8", label: "data(label)", "text-wrap": "wrap", "text-valign": "center", "font-size": 10, "font-family": "ui-monospace, monospace", width: (e) => Math.max(50, 6.4 * Math.max(...e.data("label").split("\n").map((l) => l.length))), height: 30, color: "#1c2533" } },
  { selector: "node[kind = 'input']", style: { "background-color": "#d7f0dd", "border-color": "#3f9b58" } },
  { selector: "node[kind = 'state']", style: { "background-color": "#f1f1f1", "border-color": "#b5b5b5", color: "#666" } },
  { selector: "node[kind = 'output']", style: { "background-color": "#fbe3c7", "border-color": "#d08a2f" } },
  { selector: "node[kind = 'noncore']", style: { "background-color": "#ffd8d2", "border-color": "#d9534f", "border-width": 2 } },
  { selector: "node[kind = 'control']", style: { "background-color": "#eadcf7", "border-color": "#7b4fb0", "border-width": 2, "border-style": "double" } },
  { selector: ":parent", style: { "background-color": "#faf7fe", "background-opacity": 0.6, "border-color": "#7b4fb0", "border-style": "dashed", label: "data(label)", "text-valign": "top", "text-halign": "center", "font-size": 11, color: "#7b4fb0" } },
  { selector: "node:selected", style: { "border-color": "#f0a202", "border-width": 3 } },
  { selector: "node.match", style: { "border-color": "#f0a202", "border-width": 3, "underlay-color": "#f0a202", "underlay-opacity": 0.25, "underlay-padding": 4 } },
  { selector: "edge", style: { width: 1.2, "line-color": "#9aa6b8", "target-arrow-color": "#9aa6b8", "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.8 } },
  { selector: "edge.body", style: { "line-style": "dashed", "line-color": "#7b4fb0", "target-arrow-color": "#7b4fb0" } },
];

/** Draw `doc` (graph.json) into `host`; non-core ATen ops in `nonCore` are highlighted. */
export function renderGraph(host, doc, { nonCore = new Set() } = {}) {
  const index = new Map();
  const canvas = h("div", { class: "graph-canvas", id: "graph-canvas" });
  const details = h("aside", { class: "graph-details", id: "node-details" }, h("p", { class: "muted" }, "Click a node for its shape, dtype, source line and module."));
  const search = h("input", { type: "search", id: "graph-search", placeholder: "Find a node (name or op)…", "aria-label": "find a node" });
  const status = h("span", { class: "muted small", id: "graph-search-status" });
  const fit = h("button", { type: "button", class: "small" }, "Fit");
  const expandAll = h("button", { type: "button", class: "small", id: "expand-all" }, "Expand all subgraphs");
  const legend = h("div", { class: "legend small" },
    ...[["input", "input"], ["state", "parameter / buffer"], ["op", "core ATen op"], ["noncore", "outside core ATen"], ["control", "cond / map (expandable)"], ["output", "output"]]
      .map(([kind, label]) => h("span", {}, h("span", { class: `swatch kind-${kind}` }), label)));
  fill(host, h("div", { class: "graph-toolbar" }, search, status, fit, Object.keys(doc.graph.subgraphs || {}).length ? expandAll : null), legend, h("div", { class: "graph-body" }, canvas, details));

  const count = doc.graph.nodes.length;
  const cy = cytoscape({
    container: canvas,
    elements: elementsOf(doc.graph, "", null, nonCore, index),
    style: STYLE,
    wheelSensitivity: 0.3,
    minZoom: 0.05,
    maxZoom: 4,
  });
  host.cy = cy; // for tests and for people poking at it from the console
  const layout = () => cy.layout({ name: "dagre", rankDir: "TB", nodeSep: 18, rankSep: 28, animate: false, fit: true, padding: 20 }).run();
  layout();
  host.dataset.nodes = String(count);
  if (count > LARGE) status.textContent = `${count} nodes: zoom in to read labels`;

  const expanded = new Map();
  function expand(id, name) {
    const key = `${id}::${name}`;
    if (expanded.has(key)) {
      cy.remove(cy.getElementById(expanded.get(key)));
      expanded.delete(key);
      layout();
      return;
    }
    const { graph } = index.get(id);
    const sub = graph.subgraphs[name];
    const parent = `${id}::${name}`;
    cy.add({ group: "nodes", data: { id: parent, label: `${name} (body of ${index.get(id).node.name})`, kind: "body" } });
    cy.add(elementsOf(sub, `${parent}/`, parent, nonCore, index));
    cy.add({ group: "edges", data: { id: `${parent}<-`, source: id, target: parent }, classes: "body" });
    expanded.set(key, parent);
    layout();
  }

  function show(id) {
    const entry = index.get(id);
    if (!entry) return;
    const { node, graph } = entry;
    const sub = subgraphsOf(node, graph.subgraphs || {});
    const args = JSON.stringify(node.args, (k, v) => (v && typeof v === "object" && typeof v.node === "string" && Object.keys(v).length === 1 ? `%${v.node}` : v));
    const row = (label, value, key) => h("tr", { "data-field": key }, h("th", {}, label), h("td", {}, value));
    fill(details, 
      h("h3", {}, h("code", { "data-node": node.name }, node.name)),
      h("table", { class: "kv" },
        row("op", node.op, "op"),
        row("target", h("code", {}, node.target), "target"),
        row("shape", node.shape ? formatShape(node.shape) : node.outputs ? node.outputs.map((o) => (o ? formatShape(o.shape) : "—")).join(", ") : "—", "shape"),
        row("dtype", node.dtype || (node.outputs ? node.outputs.map((o) => o?.dtype || "—").join(", ") : "—"), "dtype"),
        row("source", node.source ? [h("code", {}, `${node.source.file}:${node.source.line}`), h("pre", { class: "inline" }, node.source.code)] : "—", "source"),
        row("module", node.module_stack?.length ? node.module_stack.map((m) => h("div", {}, h("code", {}, m.path), ` ${m.type}`)) : "— (top level)", "module"),
        row("args", h("code", { class: "args" }, args.length > 400 ? `${args.slice(0, 400)}…` : args), "args"),
        nonCore.has(node.target) ? row("note", "outside the core ATen operator set", "note") : null),
      sub.length ? h("div", { class: "actions" }, sub.map((name) => {
        const button = h("button", { type: "button", class: "small", "data-subgraph": name, "data-expanded": String(expanded.has(`${id}::${name}`)) }, expanded.has(`${id}::${name}`) ? `Collapse ${name}` : `Expand ${name}`);
        button.addEventListener("click", () => {
          expand(id, name);
          show(id);
        });
        return button;
      })) : null);
  }

  cy.on("tap", "node", (event) => {
    if (event.target.isParent()) return;
    show(event.target.id());
  });

  let matches = [];
  let position = 0;
  let lastQuery = "";
  function find() {
    const query = search.value.trim().toLowerCase();
    cy.nodes().removeClass("match");
    if (!query) {
      status.textContent = "";
      return;
    }
    if (query !== lastQuery) {
      matches = cy.nodes().filter((n) => !n.isParent() && (String(n.data("name")).toLowerCase().includes(query) || String(n.data("target")).toLowerCase().includes(query)));
      position = 0;
      lastQuery = query;
    } else {
      position = matches.length ? (position + 1) % matches.length : 0;
    }
    matches.addClass("match");
    if (!matches.length) {
      status.textContent = "no match";
      status.dataset.matches = "0";
      return;
    }
    const node = matches[position];
    status.textContent = `${position + 1} of ${matches.length}`;
    status.dataset.matches = String(matches.length);
    cy.nodes().unselect();
    node.select();
    cy.animate({ center: { eles: node }, zoom: Math.max(cy.zoom(), 1.2) }, { duration: 200 });
    show(node.id());
  }
  search.addEventListener("keydown", (event) => {
    if (event.key === "Enter") {
      event.preventDefault();
      find();
    }
  });
  search.addEventListener("input", () => {
    lastQuery = "";
    if (!search.value) find();
  });
  fit.addEventListener("click", () => cy.fit(undefined, 20));
  expandAll.addEventListener("click", () => {
    for (const [id, { node, graph }] of [...index]) {
      for (const name of subgraphsOf(node, graph.subgraphs || {})) if (!expanded.has(`${id}::${name}`)) expand(id, name);
    }
  });
  return cy;
}
