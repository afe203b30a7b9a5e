// The graph's details panel: everything graph.json says of a node (nothing cut short: long
// values wrap), or a module group's type, path, size and ops.
import { h, formatShape } from "./dom.js";

const LINKS = 40;

function row(label, value, key, attrs = {}) {
  return h("tr", { "data-field": key, ...attrs }, h("th", {}, label), h("td", {}, value));
}

/** Node names as buttons that go to the node; at most LINKS of them, then a count. */
function links(names, go) {
  if (!names?.length) return "—";
  return h("div", { class: "node-links" },
    names.slice(0, LINKS).map((name) => h("button", { type: "button", class: "link", "data-goto": name, onclick: () => go(name) }, h("code", {}, name))),
    names.length > LINKS ? h("span", { class: "muted" }, ` and ${names.length - LINKS} more`) : null);
}

function sourceCell(node) {
  if (node.source) return [h("code", {}, `${node.source.file}:${node.source.line}`), h("pre", { class: "inline" }, node.source.code)];
  const lib = node.library_source;
  if (lib) {
    return [h("code", {}, `${lib.file}:${lib.line}`), " ", h("span", { class: "badge library", title: "no line of your upload made this node: the deepest frame of its stack, in an installed library" }, "library code"),
      lib.code ? h("pre", { class: "inline" }, lib.code) : null];
  }
  return "—";
}

/** The details of one graph node. */
export function nodeDetails(node, { nonCore, module, inputs, users, go, subgraphs }) {
  const args = JSON.stringify(node.args, (k, v) => (v && typeof v === "object" && typeof v.node === "string" && Object.keys(v).length === 1 ? `%${v.node}` : v));
  const kwargs = Object.keys(node.kwargs || {}).length ? JSON.stringify(node.kwargs) : null;
  return [
    h("h3", {}, h("code", { "data-node": node.name }, node.name)),
    h("table", { class: "kv" },
      row("op", node.op, "op"),
      row("target", h("code", {}, node.target), "target"),
      row("shape", node.shape ? formatShape(node.shape) : node.outputs ? node.outputs.map((o) => (o ? formatShape(o.shape) : "—")).join(", ") : "—", "shape"),
      row("dtype", node.dtype || (node.outputs ? node.outputs.map((o) => o?.dtype || "—").join(", ") : "—"), "dtype"),
      row("source", sourceCell(node), "source", node.source ? {} : node.library_source ? { "data-library": "true" } : {}),
      row("module", node.module_stack?.length ? node.module_stack.map((m) => h("div", {}, h("code", {}, m.path), ` ${m.type}`)) : module?.path ? h("div", {}, h("code", {}, module.path), ` ${module.type} (where its users are)`) : "— (top level)", "module"),
      node.decomposed_from ? row("decomposed from", h("code", {}, node.decomposed_from), "decomposed-from") : null,
      row("inputs", links(inputs, go), "inputs"),
      row("users", links(users, go), "users"),
      row("args", h("pre", { class: "args" }, args), "args"),
      kwargs ? row("kwargs", h("pre", { class: "args" }, kwargs), "kwargs") : null,
      nonCore.has(node.target) ? row("note", "outside the core ATen operator set", "note") : null),
    subgraphs.length ? h("div", { class: "actions" }, subgraphs.map(({ name, expanded, toggle }) =>
      h("button", { type: "button", class: "small", "data-subgraph": name, "data-expanded": String(expanded), onclick: toggle }, expanded ? `Collapse ${name}` : `Expand ${name}`))) : null,
  ];
}

/** The details of a module group: what it is, how much it holds, its ops; open or collapse it. */
export function groupDetails(tree, id, isOpen, { open, close, opsOf, nonCore }) {
  const group = tree.groups.get(id);
  const ops = opsOf(tree, id);
  const calls = ops.reduce((sum, [, n]) => sum + n, 0);
  return [
    h("h3", {}, h("code", { "data-group": group.path }, group.path)),
    h("table", { class: "kv" },
      row("module", group.type, "type"),
      row("holds", `${calls} op calls, ${group.size} nodes, ${group.children.length} submodule${group.children.length === 1 ? "" : "s"}`, "size"),
      row("ops", ops.length ? h("ul", { class: "group-ops" }, ops.slice(0, 20).map(([op, n]) => h("li", { "data-op": op, class: nonCore.has(op) ? "non-core" : "" }, h("code", {}, op), ` ×${n}`)),
        ops.length > 20 ? h("li", { class: "muted" }, `${ops.length - 20} more ops`) : null) : "—", "ops")),
    h("div", { class: "actions" }, isOpen
      ? h("button", { type: "button", class: "small", "data-action": "collapse", onclick: close }, "Collapse")
      : h("button", { type: "button", class: "small", "data-action": "open", onclick: open }, "Open")),
  ];
}
