// The graph grouped by module hierarchy (graph.json's module_stack): which groups exist, which
// of them are drawn open, and the elements and edges of what is drawn. Data only, no DOM, so
// a large graph never costs more than what is on screen.

export const ROOT = "";
const STATE = /^(p|b|c)_/;

/** The node names a node's args and kwargs refer to. */
export function refs(value, found = []) {
  if (Array.isArray(value)) value.forEach((v) => refs(v, found));
  else if (value && typeof value === "object") {
    if (typeof value.node === "string" && Object.keys(value).length === 1) found.push(value.node);
    else Object.values(value).forEach((v) => refs(v, found));
  }
  return found;
}

/** Whether a placeholder is a parameter, buffer or constant (torch.export names them p_, b_, c_). */
export function isState(node) {
  return node.op === "placeholder" && STATE.test(node.name);
}

/**
 * The module tree of `graph`: a group per module path, each node in the deepest module it ran
 * in; parameters, buffers and get_attr nodes in the deepest module all their users share
 * (so a layer's weights fold with it); inputs and the output at the top.
 */
export function moduleTree(graph) {
  const groups = new Map([[ROOT, { id: ROOT, path: "", type: "", name: "", parent: null, depth: 0, children: [], nodes: [], size: 0 }]]);
  const groupOf = new Map();
  const byName = new Map(graph.nodes.map((n) => [n.name, n]));
  const inputs = new Map();
  const users = new Map(graph.nodes.map((n) => [n.name, []]));
  for (const node of graph.nodes) {
    const sources = [...new Set(refs([node.args, node.kwargs]).filter((name) => byName.has(name)))];
    inputs.set(node.name, sources);
    for (const source of sources) users.get(source).push(node.name);
  }
  const groupFor = (frames) => {
    let parent = ROOT;
    for (const frame of frames) {
      const id = `m:${frame.path}`;
      if (!groups.has(id)) {
        const above = groups.get(parent);
        const name = above.path && frame.path.startsWith(`${above.path}.`) ? frame.path.slice(above.path.length + 1) : frame.path;
        groups.set(id, { id, path: frame.path, type: frame.type, name, parent, depth: above.depth + 1, children: [], nodes: [], size: 0 });
        above.children.push(id);
      }
      parent = id;
    }
    return parent;
  };
  const pending = [];
  for (const node of graph.nodes) {
    if (node.module_stack?.length) groupOf.set(node.name, groupFor(node.module_stack));
    else if (isState(node) || node.op === "get_attr") pending.push(node.name);
    else groupOf.set(node.name, ROOT);
  }
  const chain = (id) => {
    const out = [];
    for (let g = id; g !== null; g = groups.get(g).parent) out.unshift(g);
    return out;
  };
  for (const name of pending) {
    const placed = users.get(name).map((user) => groupOf.get(user)).filter((g) => g !== undefined);
    let common = placed.length ? chain(placed[0]) : [ROOT];
    for (const other of placed.slice(1)) {
      const path = chain(other);
      let i = 0;
      while (i < common.length && i < path.length && common[i] === path[i]) i += 1;
      common = common.slice(0, i);
    }
    groupOf.set(name, common[common.length - 1] ?? ROOT);
  }
  for (const node of graph.nodes) groups.get(groupOf.get(node.name)).nodes.push(node.name);
  const sizeOf = (id) => {
    const group = groups.get(id);
    group.size = group.nodes.length + group.children.reduce((sum, child) => sum + sizeOf(child), 0);
    return group.size;
  };
  sizeOf(ROOT);
  return { groups, groupOf, inputs, users, byName, chain };
}

/** The groups to open so that node `name` is drawn (outermost first, the top left out). */
export function ancestorsOf(tree, name) {
  return tree.chain(tree.groupOf.get(name)).slice(1);
}

/** What stands for node `name` on screen: itself, or its outermost collapsed group. */
export function representative(tree, expanded, name) {
  for (const id of ancestorsOf(tree, name)) if (!expanded.has(id)) return id;
  return name;
}

/** How many boxes `expanded` draws (open groups' frames included). */
export function visibleCount(tree, expanded) {
  let count = 0;
  const visit = (id) => {
    const group = tree.groups.get(id);
    count += group.nodes.length;
    for (const child of group.children) {
      count += 1;
      if (expanded.has(child)) visit(child);
    }
  };
  visit(ROOT);
  return count;
}

/** The groups at `depth` whose parents are open. */
export function level(tree, expanded, depth) {
  return [...tree.groups.values()].filter((g) => g.depth === depth && expanded.has(g.parent)).map((g) => g.id);
}

/**
 * Open whole levels of the tree, outermost first, while `fits(expanded)` says the drawing
 * stays readable: every group starts collapsed, and a small graph ends fully open.
 */
export function initialExpansion(tree, fits) {
  let expanded = new Set([ROOT]);
  for (let depth = 1; ; depth += 1) {
    const next = level(tree, expanded, depth);
    if (!next.length) return expanded;
    const candidate = new Set([...expanded, ...next]);
    if (!fits(candidate)) return expanded;
    expanded = candidate;
  }
}

/**
 * What `expanded` draws: open groups as frames (`open: true`) around what they hold,
 * collapsed groups as one box each, the nodes of open groups, and one edge per pair of drawn
 * boxes that some graph edge joins (`count` of them).
 */
export function visibleGraph(tree, expanded) {
  const groups = [];
  const nodes = [];
  const visit = (id) => {
    const group = tree.groups.get(id);
    const parent = id === ROOT ? null : id;
    for (const name of group.nodes) nodes.push({ name, parent });
    for (const child of group.children) {
      const open = expanded.has(child);
      groups.push({ group: tree.groups.get(child), parent, open });
      if (open) visit(child);
    }
  };
  visit(ROOT);
  const edges = new Map();
  for (const [target, sources] of tree.inputs) {
    const to = representative(tree, expanded, target);
    for (const source of sources) {
      const from = representative(tree, expanded, source);
      if (from === to) continue;
      const key = `${from}->${to}`;
      const edge = edges.get(key);
      if (edge) edge.count += 1;
      else edges.set(key, { source: from, target: to, count: 1 });
    }
  }
  return { groups, nodes, edges: [...edges.values()] };
}

/** Ops of a group and everything under it, counted by target, most frequent first. */
export function opsOf(tree, id) {
  const counts = new Map();
  const visit = (gid) => {
    const group = tree.groups.get(gid);
    for (const name of group.nodes) {
      const node = tree.byName.get(name);
      if (node.op === "call_function") counts.set(node.target, (counts.get(node.target) || 0) + 1);
    }
    group.children.forEach(visit);
  };
  visit(id);
  return [...counts].sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
}
