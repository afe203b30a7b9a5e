// The interactive graph: cytoscape with a dagre layout (vendored, see vendor.js), drawn on a
// canvas, grouped by module hierarchy (graph_groups.js). Groups start collapsed and whole levels
// open while the drawing stays readable at "fit"; a click opens a group, search opens the
// groups around a match. Only what is drawn is ever handed to cytoscape.
import { cytoscape } from "./vendor.js";
import { h, fill, formatShape } from "./dom.js";
import { subgraphsOf } from "./model_explorer.js";
import { ROOT, moduleTree, initialExpansion, visibleGraph, visibleCount, ancestorsOf, opsOf, refs } from "./graph_groups.js";
import { searchGraph, shortOp } from "./graph_search.js";
import { nodeDetails, groupDetails } from "./graph_details.js";

/** The least zoom at which labels stay readable; levels open only while "fit" stays above it. */
export const READABLE_ZOOM = 0.65;
/** At most this many boxes are drawn before a level is opened on its own. */
export const MAX_DRAWN = 160;
/** A graph of at most this many nodes opens whole, however small "fit" draws it. */
export const SMALL = 40;

function label(node) {
  const shape = node.shape ? formatShape(node.shape) : node.outputs ? `${node.outputs.length} outputs` : "";
  const name = node.op === "call_function" ? shortOp(node.target) : node.op === "placeholder" ? node.name : node.op === "output" ? "output" : node.target;
  return shape ? `${name}\n${shape}` : name;
}

function kindOf(node, subgraphs, nonCore) {
  if (node.op === "placeholder") return /^(p|b|c)_/.test(node.name) ? "state" : "input";
  if (node.op === "output") return "output";
  if (subgraphsOf(node, subgraphs).length) return "control";
  if (node.op === "get_attr") return "state";
  if (nonCore.has(node.target)) return "noncore";
  return "op";
}

/** Elements of a cond/map body with ids under `prefix`, inside compound `parent`. */
function bodyElements(graph, prefix, parent, nonCore, index) {
  const elements = [];
  const names = new Set(graph.nodes.map((n) => n.name));
  for (const node of graph.nodes) {
    const id = prefix + node.name;
    index.set(id, { node, graph });
    elements.push({ group: "nodes", data: { id, label: label(node), kind: kindOf(node, graph.subgraphs || {}, nonCore), name: node.name, target: node.target, parent } });
    refs([node.args, node.kwargs]).forEach((source, i) => {
      if (names.has(source)) elements.push({ group: "edges", data: { id: `${id}<-${i}`, source: prefix + source, target: id } });
    });
  }
  return elements;
}

const width = (e) => Math.max(50, 6.4 * Math.max(...e.data("label").split("\n").map((l) => l.length)));
const STYLE = [
  { selector: "node", style: { shape: "round-rectangle", "background-color": "#e8eef9", "border-width": 1, "border-color": "#8aa1c8", label: "data(label)", "text-wrap": "wrap", "text-valign": "center", "font-size": 10, "font-family": "ui-monospace, monospace", width, height: 30, color: "#1c2533" } },
  { selector: "node[kind = 'input']", style: { "background-color": "#d7f0dd", "border-color": "#3f9b58" } },
  { selector: "node[kind = 'state']", style: { "background-color": "#f1f1f1", "border-color": "#b5b5b5", color: "#666" } },
  { selector: "node[kind = 'output']", style: { "background-color": "#fbe3c7", "border-color": "#d08a2f" } },
  { selector: "node[kind = 'noncore']", style: { "background-color": "#ffd8d2", "border-color": "#d9534f", "border-width": 2 } },
  { selector: "node[kind = 'control']", style: { "background-color": "#eadcf7", "border-color": "#7b4fb0", "border-width": 2, "border-style": "double" } },
  { selector: "node[kind = 'group']", style: { "background-color": "#dfe9f7", "border-color": "#3d6fb6", "border-width": 2, "font-size": 12, "font-family": "system-ui, sans-serif", width: (e) => Math.max(90, 7.4 * Math.max(...e.data("label").split("\n").map((l) => l.length))), height: 44 } },
  { selector: "node[kind = 'group'][noncore > 0]", style: { "border-color": "#d9534f" } },
  { selector: "node[kind = 'module']", style: { "background-color": "#f4f7fc", "background-opacity": 0.7, "border-color": "#3d6fb6", "border-style": "dashed", label: "data(label)", "text-valign": "top", "text-halign": "center", "font-size": 11, "font-family": "system-ui, sans-serif", color: "#3d6fb6" } },
  { selector: "node[kind = 'body']", style: { "background-color": "#faf7fe", "background-opacity": 0.6, "border-color": "#7b4fb0", "border-style": "dashed", label: "data(label)", "text-valign": "top", "text-halign": "center", "font-size": 11, color: "#7b4fb0" } },
  { selector: "node:selected", style: { "border-color": "#f0a202", "border-width": 3 } },
  { selector: "node.match", style: { "border-color": "#f0a202", "border-width": 3, "underlay-color": "#f0a202", "underlay-opacity": 0.25, "underlay-padding": 4 } },
  { selector: "edge", style: { width: (e) => Math.min(5, 1.2 + Math.log2(e.data("count") || 1)), "line-color": "#9aa6b8", "target-arrow-color": "#9aa6b8", "target-arrow-shape": "triangle", "curve-style": "bezier", "arrow-scale": 0.8 } },
  { selector: "edge.body", style: { "line-style": "dashed", "line-color": "#7b4fb0", "target-arrow-color": "#7b4fb0" } },
];

/** Draw `doc` (graph.json) into `host`; non-core ATen ops in `nonCore` are highlighted, and
 * `decomposition` (report.decomposition) lets search find the ops decomposition removed. */
export function renderGraph(host, doc, { nonCore = new Set(), decomposition = null } = {}) {
  const graph = doc.graph;
  const tree = moduleTree(graph);
  const index = new Map(graph.nodes.map((node) => [node.name, { node, graph }]));
  const canvas = h("div", { class: "graph-canvas", id: "graph-canvas" });
  const details = h("aside", { class: "graph-details", id: "node-details" }, h("p", { class: "muted" }, "Click a module to open it, a node for its shape, dtype, source line and module."));
  const search = h("input", { type: "search", id: "graph-search", placeholder: "Find a node or op (before or after decomposition)…", "aria-label": "find a node" });
  const status = h("span", { class: "muted small", id: "graph-search-status" });
  const results = h("ul", { class: "search-results small", id: "graph-search-results" });
  const removedList = h("ul", { class: "search-removed small", id: "graph-search-decomposed" });
  const button = (text, id) => h("button", { type: "button", class: "small", id }, text);
  const fit = button("Fit", "graph-fit");
  const openAll = button("Open all modules", "open-all");
  const closeAll = button("Collapse all", "collapse-all");
  const expandAll = button("Expand all subgraphs", "expand-all");
  const legend = h("div", { class: "legend small" },
    ...[["group", "module (click to open)"], ["input", "input"], ["state", "parameter / buffer"], ["op", "core ATen op"], ["noncore", "outside core ATen"], ["control", "cond / map (expandable)"], ["output", "output"]]
      .map(([kind, text]) => h("span", {}, h("span", { class: `swatch kind-${kind}` }), text)));
  fill(host,
    h("div", { class: "graph-toolbar" }, search, status, fit, openAll, closeAll, Object.keys(graph.subgraphs || {}).length ? expandAll : null),
    results, removedList, legend,
    h("div", { class: "graph-body" }, canvas, details));

  const cy = cytoscape({ container: canvas, style: STYLE, wheelSensitivity: 0.3, minZoom: 0.05, maxZoom: 4 });
  host.cy = cy; // for tests and for people poking at it from the console
  host.dataset.nodes = String(graph.nodes.length);
  const nonCoreIn = new Map();
  for (const group of tree.groups.values()) nonCoreIn.set(group.id, opsOf(tree, group.id).filter(([op]) => nonCore.has(op)).reduce((sum, [, n]) => sum + n, 0));

  let expanded = new Set([ROOT]);
  const bodies = new Map(); // `${id}::${name}` → the body's compound id

  function elements() {
    const drawn = visibleGraph(tree, expanded);
    const out = [];
    for (const { group, parent, open } of drawn.groups) {
      const ops = opsOf(tree, group.id).reduce((sum, [, n]) => sum + n, 0);
      out.push({ group: "nodes", data: { id: group.id, kind: open ? "module" : "group", group: true, noncore: nonCoreIn.get(group.id), label: open ? `${group.name} · ${group.type}` : `${group.name}\n${group.type} · ${ops} op${ops === 1 ? "" : "s"}`, ...(parent ? { parent } : {}) } });
    }
    for (const { name, parent } of drawn.nodes) {
      const node = tree.byName.get(name);
      out.push({ group: "nodes", data: { id: name, label: label(node), kind: kindOf(node, graph.subgraphs || {}, nonCore), name, target: node.target, ...(parent ? { parent } : {}) } });
    }
    for (const edge of drawn.edges) out.push({ group: "edges", data: { id: `${edge.source}->${edge.target}`, ...edge } });
    const drawnNames = new Set(drawn.nodes.map((n) => n.name));
    for (const [key, parent] of bodies) {
      const [id, name] = key.split("::");
      if (!drawnNames.has(id)) continue;
      const sub = index.get(id).graph.subgraphs[name];
      out.push({ group: "nodes", data: { id: parent, label: `${name} (body of ${id})`, kind: "body" } });
      out.push(...bodyElements(sub, `${parent}/`, parent, nonCore, index));
      out.push({ group: "edges", data: { id: `${parent}<-`, source: id, target: parent }, classes: "body" });
    }
    return out;
  }

  function draw({ fitAll = true } = {}) {
    cy.startBatch();
    cy.elements().remove();
    cy.add(elements());
    cy.endBatch();
    cy.layout({ name: "dagre", rankDir: "TB", nodeSep: 18, rankSep: 28, animate: false, fit: fitAll, padding: 20 }).run();
    host.dataset.drawn = String(cy.nodes().length);
    host.dataset.open = String(expanded.size - 1);
  }

  /** The zoom "fit" would use for what is drawn. */
  function fitZoom() {
    const box = cy.elements().boundingBox();
    if (!box.w || !box.h) return Infinity;
    return Math.min((canvas.clientWidth - 40) / box.w, (canvas.clientHeight - 40) / box.h);
  }

  expanded = initialExpansion(tree, (candidate) => {
    if (graph.nodes.length <= SMALL) return true;
    if (visibleCount(tree, candidate) > MAX_DRAWN) return false;
    expanded = candidate;
    draw({ fitAll: false });
    return fitZoom() >= READABLE_ZOOM;
  });
  draw();
  cy.fit(undefined, 20);

  /** Show an opened group: whole when that stays readable, else its top at a readable zoom. */
  function focusGroup(id) {
    const element = cy.getElementById(id);
    if (!element.length) return;
    cy.fit(element, 30);
    if (cy.zoom() > 1.5) cy.zoom({ level: 1.5, renderedPosition: element.renderedPosition() });
    if (cy.zoom() >= READABLE_ZOOM) return;
    const box = element.boundingBox();
    cy.zoom(1);
    cy.pan({ x: canvas.clientWidth / 2 - (box.x1 + box.w / 2), y: 20 - box.y1 });
  }

  function open(id) {
    if (expanded.has(id)) return;
    expanded = new Set([...expanded, id]);
    draw({ fitAll: false });
    focusGroup(id);
  }

  function close(id) {
    // Closing a group closes what is inside it too.
    expanded = new Set([...expanded].filter((g) => g === ROOT || !tree.chain(g).includes(id)));
    draw({ fitAll: false });
    const element = cy.getElementById(id);
    if (element.length) cy.center(element);
  }

  function toggleBody(id, name) {
    const key = `${id}::${name}`;
    if (bodies.has(key)) bodies.delete(key);
    else bodies.set(key, key);
    draw({ fitAll: false });
  }

  function showGroup(id) {
    fill(details, groupDetails(tree, id, expanded.has(id), {
      open: () => { open(id); showGroup(id); },
      close: () => { close(id); showGroup(id); },
      opsOf,
      nonCore,
    }));
  }

  function show(id) {
    const entry = index.get(id);
    if (!entry) return;
    const { node, graph: owner } = entry;
    fill(details, nodeDetails(node, {
      nonCore,
      module: owner === graph ? tree.groups.get(tree.groupOf.get(node.name)) : null,
      inputs: owner === graph ? tree.inputs.get(node.name) : [],
      users: owner === graph ? tree.users.get(node.name) : [],
      go: focus,
      subgraphs: subgraphsOf(node, owner.subgraphs || {}).map((name) => ({ name, expanded: bodies.has(`${id}::${name}`), toggle: () => { toggleBody(id, name); show(id); } })),
    }));
  }

  /** Open the groups around node `name`, select it, center it and show its details. */
  function focus(name) {
    const missing = ancestorsOf(tree, name).filter((g) => !expanded.has(g));
    if (missing.length) {
      expanded = new Set([...expanded, ...missing]);
      draw({ fitAll: false });
    }
    const element = cy.getElementById(name);
    cy.nodes().unselect();
    element.select();
    cy.stop(true, true);
    cy.animate({ center: { eles: element }, zoom: Math.max(cy.zoom(), 1.2) }, { duration: 200 });
    show(name);
  }

  cy.on("tap", "node", (event) => {
    const target = event.target;
    const kind = target.data("kind");
    if (kind === "group") {
      open(target.id());
      showGroup(target.id());
    } else if (kind === "module") showGroup(target.id());
    else if (kind !== "body") show(target.id());
  });
  cy.on("dbltap", "node[kind = 'module']", (event) => close(event.target.id()));

  let found = { matches: [], removed: [] };
  let position = 0;
  let lastQuery = "";
  function find() {
    const query = search.value.trim();
    cy.nodes().removeClass("match");
    if (!query) {
      status.textContent = "";
      delete status.dataset.matches;
      results.replaceChildren();
      removedList.replaceChildren();
      lastQuery = "";
      return;
    }
    if (query !== lastQuery) {
      found = searchGraph(graph, query, decomposition);
      position = 0;
      lastQuery = query;
      fill(results, found.matches.slice(0, 8).map((name) => {
        const node = tree.byName.get(name);
        const module = tree.groups.get(tree.groupOf.get(name));
        return h("li", {}, h("button", { type: "button", class: "link", "data-node": name, onclick: () => focus(name) }, h("code", {}, name), name.startsWith(shortOp(node.target)) ? "" : ` ${shortOp(node.target)}`), module.path ? h("span", { class: "muted" }, ` in ${module.path}`) : null);
      }), found.matches.length > 8 ? h("li", { class: "muted" }, `… ${found.matches.length - 8} more: Enter steps through all`) : null);
      fill(removedList, found.removed.map((r) => h("li", { "data-op": r.op, "data-before": r.before ?? "", "data-into": (r.into || []).join(","), "data-nodes": String(r.nodes.length), "data-removed": String(r.removed) },
        h("code", {}, r.op), r.before !== null ? ` · ${r.before} call${r.before === 1 ? "" : "s"} before decomposition` : "",
        r.removed ? " · decomposed away" : " · partly decomposed",
        r.into ? [" into ", r.into.map((op, i) => [i ? ", " : "", h("code", {}, op)]), ` (${r.nodes.length} node${r.nodes.length === 1 ? "" : "s"} now)`]
          : r.introduced.length ? [" · decomposition introduced ", r.introduced.map((op, i) => [i ? ", " : "", h("code", {}, op)])] : "")));
    } else {
      position = found.matches.length ? (position + 1) % found.matches.length : 0;
    }
    status.dataset.matches = String(found.matches.length);
    if (!found.matches.length) {
      status.textContent = found.removed.length ? "no node: decomposed away" : "no match";
      return;
    }
    status.textContent = `${position + 1} of ${found.matches.length}`;
    focus(found.matches[position]);
    for (const name of found.matches) cy.getElementById(name).addClass("match");
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
  openAll.addEventListener("click", () => {
    expanded = new Set(tree.groups.keys());
    draw();
  });
  closeAll.addEventListener("click", () => {
    expanded = new Set([ROOT]);
    draw();
  });
  expandAll.addEventListener("click", () => {
    for (const node of graph.nodes) {
      for (const name of subgraphsOf(node, graph.subgraphs || {})) {
        bodies.set(`${node.name}::${name}`, `${node.name}::${name}`);
        for (const g of ancestorsOf(tree, node.name)) expanded.add(g);
      }
    }
    draw();
  });
  host.graphView = { tree, open, close, focus, get expanded() { return new Set(expanded); }, READABLE_ZOOM };
  return cy;
}
