// graph.json → Google AI Edge Model Explorer's graph JSON (a GraphCollection), so the graph
// opens there too: nodes with attrs, incoming edges, output metadata, module namespaces.

function shapeText(shape, dtype) {
  if (!shape) return dtype || "";
  return `${dtype || "?"}[${shape.join(",")}]`;
}

function nodeRefs(value, found = []) {
  if (Array.isArray(value)) value.forEach((v) => nodeRefs(v, found));
  else if (value && typeof value === "object") {
    if (typeof value.node === "string" && Object.keys(value).length === 1) found.push(value.node);
    else Object.values(value).forEach((v) => nodeRefs(v, found));
  }
  return found;
}

/** The subgraph names a node refers to (the bodies of cond/map are get_attr targets). */
export function subgraphsOf(node, subgraphs) {
  const names = new Set();
  const visit = (value) => {
    if (typeof value === "string" && subgraphs[value]) names.add(value);
    else if (Array.isArray(value)) value.forEach(visit);
    else if (value && typeof value === "object") Object.values(value).forEach(visit);
  };
  visit(node.args);
  visit(node.kwargs);
  if (node.op === "get_attr" && subgraphs[node.target]) names.add(node.target);
  return [...names];
}

/** Convert one graph.json graph to a Model Explorer graph with id `id`. */
export function convertGraph(graph, id) {
  const byName = new Map(graph.nodes.map((n) => [n.name, n]));
  const nodes = graph.nodes.map((node) => {
    const attrs = [
      { key: "op", value: node.op },
      { key: "target", value: node.target },
    ];
    if (node.shape) attrs.push({ key: "shape", value: `[${node.shape.join(", ")}]` });
    if (node.dtype) attrs.push({ key: "dtype", value: node.dtype });
    if (node.source) attrs.push({ key: "source", value: `${node.source.file}:${node.source.line}: ${node.source.code}` });
    else if (node.library_source) attrs.push({ key: "library_source", value: `${node.library_source.file}:${node.library_source.line}: ${node.library_source.code ?? ""}` });
    if (node.decomposed_from) attrs.push({ key: "decomposed_from", value: node.decomposed_from });
    if (node.module_stack?.length) attrs.push({ key: "module", value: node.module_stack.map((m) => `${m.path} (${m.type})`).join(" / ") });
    const incomingEdges = nodeRefs([node.args, node.kwargs])
      .filter((name) => byName.has(name))
      .map((name, i) => ({ sourceNodeId: name, sourceNodeOutputId: "0", targetNodeInputId: String(i) }));
    const outputs = node.outputs
      ? node.outputs.map((meta, i) => ({ id: String(i), attrs: meta ? [{ key: "tensor_shape", value: shapeText(meta.shape, meta.dtype) }] : [] }))
      : [{ id: "0", attrs: node.shape || node.dtype ? [{ key: "tensor_shape", value: shapeText(node.shape, node.dtype) }] : [] }];
    const converted = {
      id: node.name,
      label: node.op === "call_function" ? node.target.replace(/^aten\./, "").replace(/\.default$/, "") : node.op === "placeholder" ? `input: ${node.name}` : node.op,
      // Module Explorer folds nodes by namespace: the module path, one layer per module.
      namespace: node.module_stack?.length ? node.module_stack.map((m) => m.path.split(".").pop()).join("/") : "",
      attrs,
      incomingEdges,
      outputsMetadata: outputs,
    };
    const subgraphIds = subgraphsOf(node, graph.subgraphs || {}).map((name) => `${id}/${name}`);
    if (subgraphIds.length) converted.subgraphIds = subgraphIds;
    return converted;
  });
  return { id, nodes };
}

/** The whole document: the main graph and every subgraph (nested ones too), as a GraphCollection. */
export function toModelExplorer(document, label = "torchport") {
  const graphs = [];
  const add = (graph, id) => {
    graphs.push(convertGraph(graph, id));
    for (const [name, sub] of Object.entries(graph.subgraphs || {})) add(sub, `${id}/${name}`);
  };
  add(document.graph, "main");
  return { label, graphs };
}
