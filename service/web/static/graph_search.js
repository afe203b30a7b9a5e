// Search over a graph's ops before and after decomposition: the nodes whose name or op
// matches, and each op the query names that decomposition removed, with what it became.

/** The op as people type it: aten.addmm.default → addmm. */
export function shortOp(target) {
  return String(target).replace(/^aten\./, "").replace(/\.default$/, "").replace(/^(torch\.ops\.)?higher_order\./, "");
}

/**
 * Search `graph` for `query` (case-insensitive, a part of a name or op).
 *
 * Returns `{matches, removed}`: `matches`, the names of the nodes whose name or op matches,
 * then of those decomposed from a matching op; `removed`, per matching op of the traced program
 * that decomposition took away (`decomposition.removed_ops`), `{op, before, into, nodes}`: its
 * calls before decomposition, the ops its nodes became (from each node's `decomposed_from`;
 * without that, `into` is null and `introduced` lists every op decomposition introduced), and
 * those nodes.
 */
export function searchGraph(graph, query, decomposition = null) {
  const q = query.trim().toLowerCase();
  if (!q) return { matches: [], removed: [] };
  const hit = (text) => String(text ?? "").toLowerCase().includes(q);
  const direct = graph.nodes.filter((n) => hit(n.name) || hit(n.target)).map((n) => n.name);
  const fromOps = new Map();
  for (const node of graph.nodes) {
    if (!node.decomposed_from || !hit(node.decomposed_from)) continue;
    if (!fromOps.has(node.decomposed_from)) fromOps.set(node.decomposed_from, []);
    fromOps.get(node.decomposed_from).push(node);
  }
  const removedOps = new Set(decomposition?.removed_ops || []);
  const named = new Set([...removedOps].filter(hit));
  for (const op of fromOps.keys()) named.add(op);
  const removed = [...named].sort().map((op) => {
    const nodes = fromOps.get(op) || [];
    const into = [...new Set(nodes.map((n) => n.target))].sort();
    return {
      op,
      before: decomposition?.ops_before?.[op] ?? null,
      into: nodes.length ? into : null,
      introduced: nodes.length ? [] : [...(decomposition?.added_ops || [])].sort(),
      nodes: nodes.map((n) => n.name),
      removed: removedOps.has(op) || !(graph.nodes.some((n) => n.target === op)),
    };
  });
  const seen = new Set(direct);
  const indirect = removed.flatMap((r) => r.nodes).filter((name) => !seen.has(name) && seen.add(name));
  return { matches: [...direct, ...indirect], removed };
}
