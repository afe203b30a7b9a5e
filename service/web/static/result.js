// A succeeded job: summary, downloads, graph, op histogram, signature, verification,
// the artifacts' profiles, deployment targets, decomposition, and an editor to export again
// with dynamic shapes.
import { h, fill, card, table, badge, rich, formatShape, formatBytes, formatError, formatSeconds } from "./dom.js";
import { artifactUrl, downloadArchive, downloadArtifact, saveJson } from "./api.js";
import { dimensionEditor } from "./dynamic_shapes.js";
import { toModelExplorer } from "./model_explorer.js";
import { renderGraph } from "./graph_view.js";
import { longTable } from "./long_table.js";
import { startAgain } from "./again.js";
import { artifactsCard, generationPassed } from "./profiles.js";
import { warningsCard } from "./warnings_card.js";

const ARTIFACT_HELP = {
  "program.pt2": "the exported program: torch.export.load(path)",
  "graph.json": "nodes, shapes, source lines, op histogram",
  "signature.json": "inputs, outputs, ranges, the dynamic-shapes spec used",
  "report.json": "stages, tracing attempts, verification, decomposition, targets",
  "model.onnx": "ONNX model: onnxruntime.InferenceSession(path)",
  "model.onnx.data": "the ONNX model's weights: keep beside model.onnx",
  "genai_config.json": "ONNX Runtime GenAI's configuration: og.Model(folder) generates with model.onnx",
  "model.aoti.pt2": "AOTInductor package: torch._inductor.aoti_load_package(path)",
  "model.pte": "ExecuTorch program (XNNPACK): executorch.runtime",
};

/** The deployment targets (report.targets), in the order the engine converts them. */
const TARGETS = {
  onnx: { label: "ONNX", runtime: "ONNX Runtime (CPU)" },
  aoti: { label: "AOTInductor", runtime: "torch._inductor.aoti_load_package" },
  executorch: { label: "ExecuTorch", runtime: "ExecuTorch runtime, XNNPACK delegate" },
};

export function renderResult(root, job, { report, graph, signature }, navigate) {
  const nonCore = new Set(report?.decomposition?.non_core_aten_ops || []);
  const sections = [
    summary(job, report, graph, signature),
    downloads(job, graph),
    graph ? graphCard(graph, nonCore, report?.decomposition) : null,
    graph ? histogram(graph.op_histogram, nonCore) : null,
    signature ? signatureCard(signature) : null,
    report?.verification ? verificationCard(report.verification) : null,
    report?.generation ? generationCard(report.generation) : null,
    artifactsCard(report),
    targetsCard(job, report),
    report?.decomposition ? decompositionCard(report.decomposition) : null,
    signature ? reexportCard(job, signature, navigate, report?.tracing?.dynamic_shapes?.suggested, report?.inputs) : null,
    warningsCard(report),
  ];
  fill(root, ...sections.filter(Boolean));
}

function summary(job, report, graph, signature) {
  const ops = graph ? Object.values(graph.op_histogram).reduce((a, b) => a + b, 0) : null;
  const model = report?.model;
  const userInputs = (signature?.inputs || []).filter((i) => i.kind === "user_input");
  const userOutputs = outputNames(signature, report);
  const ranges = signature?.range_constraints || graph?.range_constraints || [];
  const fixes = report?.tracing?.dynamic_shapes?.fixes || [];
  const stat = (label, value, key) => h("div", { class: "stat", "data-stat": key }, h("div", { class: "value" }, value), h("div", { class: "label" }, label));
  return card("Summary",
    h("p", { class: "success-line", "data-code": "succeeded", "data-verdict": verdictOf(report?.verification) || "" }, "✓ Exported", verdictOf(report?.verification) === "verified" ? ", verified against eager PyTorch" : verdictOf(report?.verification) === "partially_verified" ? `, ${verdictText(report.verification)} against eager PyTorch` : "", report ? ` in ${formatSeconds(report.duration_s)}` : "", "."),
    h("div", { class: "stats" },
      stat("op calls", ops ?? "—", "ops"),
      stat("distinct ops", graph ? Object.keys(graph.op_histogram).length : "—", "distinct-ops"),
      stat("parameters", model ? model.parameter_count.toLocaleString() : "—", "parameters"),
      stat("buffers", model ? model.buffer_count.toLocaleString() : "—", "buffers"),
      stat("tracing", report?.tracing?.strict_used ? "strict" : "non-strict", "tracing")),
    h("div", { class: "two-col" },
      h("div", {}, h("h3", {}, "Inputs"), ioList(userInputs.map((i) => ({ name: i.pytree_path ? `${i.name} (${i.pytree_path})` : i.name, shape: i.shape, dtype: i.dtype, value: i.value })))),
      h("div", {}, h("h3", {}, "Outputs"), ioList(userOutputs))),
    h("h3", {}, "Symbolic sizes"),
    ranges.length
      ? h("ul", { class: "ranges" }, ranges.map((r) => h("li", { "data-symbol": r.symbol }, h("code", {}, r.symbol), ` ∈ [${r.min ?? 0}, ${r.max ?? "∞"}]`)))
      : h("p", { class: "muted" }, "None: every size is fixed to the example's. Use the dynamic-shapes editor below to allow others."),
    fixes.length
      ? h("div", {}, h("h3", {}, "Dynamic-shape fixes torch suggested (applied)"), h("ul", {}, fixes.map((f) => h("li", {}, h("code", {}, f.text)))))
      : null);
}

/**
 * The program's outputs as its user knows them: a generation-ready program's by the names
 * its report gives (`report.generation.outputs`: `logits`, as the ONNX model and the docs
 * name it), else the path inside the returned structure, else the graph's own node name
 * (`view_55`) as the last resort.
 */
export function outputNames(signature, report) {
  const outputs = (signature?.outputs || []).filter((o) => o.kind === "user_output");
  const named = report?.generation?.outputs || [];
  return outputs.map((o, i) => ({
    name: named.length === outputs.length ? named[i] : o.pytree_path || o.name,
    node: o.name,
    shape: o.shape,
    dtype: o.dtype,
  }));
}

function ioList(items) {
  if (!items.length) return h("p", { class: "muted" }, "none");
  return h("ul", { class: "io" }, items.map((i) => h("li", { "data-name": i.name }, h("code", { title: i.node && i.node !== i.name ? `graph node ${i.node}` : null }, i.name), " ", h("span", { class: "shape" }, i.shape ? formatShape(i.shape) : i.value !== undefined && i.value !== null ? `= ${JSON.stringify(i.value)}` : ""), " ", h("span", { class: "muted" }, i.dtype || ""))));
}

function downloads(job, graph) {
  const buttons = (job.artifacts || []).map((a) => {
    const button = h("button", { type: "button", class: "download", "data-artifact": a.name },
      h("strong", {}, a.name), h("span", { class: "muted" }, ` ${formatBytes(a.size)}`), h("br"), h("small", { class: "muted" }, ARTIFACT_HELP[a.name] || a.media_type));
    button.addEventListener("click", () => downloadArtifact(job.id, a.name));
    return button;
  });
  if (graph) {
    const me = h("button", { type: "button", class: "download", "data-artifact": "model-explorer.json" },
      h("strong", {}, "model-explorer.json"), h("br"), h("small", { class: "muted" }, "the graph for Google AI Edge Model Explorer"));
    me.addEventListener("click", () => saveJson(toModelExplorer(graph, `torchport ${job.id}`), `${job.id}.model-explorer.json`));
    buttons.push(me);
  }
  const total = (job.artifacts || []).reduce((sum, a) => sum + a.size, 0);
  const all = h("button", { type: "button", class: "secondary", id: "download-all" },
    "Download all", h("span", { class: "muted" }, ` ${job.artifacts?.length || 0} files, ${formatBytes(total)}, one zip`));
  all.addEventListener("click", () => downloadArchive(job.id));
  return card("Downloads", h("div", { class: "actions download-all" }, all), h("div", { class: "downloads" }, buttons),
    h("p", { class: "muted small" }, "Load the program with ", h("code", {}, 'ep = torch.export.load("program.pt2"); ep.module()(*inputs)'),
      ". Open the Model Explorer file with ", h("code", {}, "model-explorer model-explorer.json"), " or its web app's upload."));
}

function graphCard(graph, nonCore, decomposition) {
  const host = h("div", { class: "graph-host" });
  const body = card("Graph", host);
  // Cytoscape needs the element in the document to measure it.
  requestAnimationFrame(() => renderGraph(host, graph, { nonCore, decomposition }));
  return body;
}

function histogram(counts, nonCore) {
  const entries = Object.entries(counts).sort((a, b) => b[1] - a[1] || a[0].localeCompare(b[0]));
  const max = Math.max(1, ...entries.map(([, n]) => n));
  return card("Op histogram",
    h("div", { class: "histogram", role: "list" }, entries.map(([op, n]) =>
      h("div", { class: `bar-row${nonCore.has(op) ? " non-core" : ""}`, role: "listitem", "data-op": op, title: nonCore.has(op) ? "outside the core ATen operator set" : "" },
        h("code", { class: "bar-label" }, op),
        h("span", { class: "bar", style: `width: ${(100 * n) / max}%` }),
        h("span", { class: "bar-count" }, String(n))))),
    nonCore.size ? h("p", { class: "muted small" }, h("span", { class: "swatch non-core" }), " outside the core ATen set (kept by request or because decomposing them failed)") : null);
}

function signatureCard(signature) {
  const columns = ["kind", "name", "target / path", "shape", "dtype"];
  const inputRow = (i) => h("tr", { "data-kind": i.kind }, h("td", {}, i.kind), h("td", {}, h("code", {}, i.name)), h("td", {}, i.target || i.pytree_path || ""),
    h("td", { class: "shape" }, i.shape ? formatShape(i.shape) : i.value !== null && i.value !== undefined ? `= ${JSON.stringify(i.value)}` : "—"), h("td", {}, i.dtype || ""));
  const user = signature.inputs.filter((i) => i.kind === "user_input");
  const state = signature.inputs.filter((i) => i.kind !== "user_input");
  return card("Signature",
    h("h3", {}, "Inputs"),
    table(columns, user.map(inputRow)),
    state.length ? [h("h3", {}, `Parameters, buffers and constants (${state.length})`), longTable(columns, state, inputRow, { class: "state-inputs" })] : null,
    h("h3", {}, "Outputs"),
    longTable(columns, signature.outputs, (o) =>
      h("tr", { "data-kind": o.kind }, h("td", {}, o.kind), h("td", {}, h("code", {}, o.name)), h("td", {}, o.target || o.pytree_path || ""), h("td", { class: "shape" }, formatShape(o.shape)), h("td", {}, o.dtype || ""))),
    signature.dynamic_shapes ? h("details", {}, h("summary", {}, "Dynamic-shapes spec used"), h("pre", {}, JSON.stringify(signature.dynamic_shapes, null, 1))) : null);
}

/** The per-sample, per-output table of a VerificationReport (the program's, or a target's). */
export function verificationTable(v) {
  const rows = [];
  for (const sample of v.samples || []) {
    const symbols = Object.entries(sample.symbols || {}).map(([k, n]) => `${k}=${n}`).join(", ");
    const outputs = sample.outputs || [];
    if (!outputs.length) {
      rows.push(h("tr", { class: `verdict-${sample.status}`, "data-sample": sample.label }, h("td", {}, sample.label), h("td", {}, symbols), h("td", { colspan: 5 }, sample.reason || ""), h("td", {}, verdict(sample.status))));
    }
    outputs.forEach((o, i) => rows.push(h("tr", { class: o.passed ? "verdict-passed" : "verdict-failed", "data-sample": sample.label, "data-output": o.path },
      h("td", {}, i === 0 ? sample.label : ""), h("td", {}, i === 0 ? symbols || "example sizes" : ""),
      h("td", {}, h("code", {}, o.path || "(the output)")), h("td", { class: "shape" }, formatShape(o.shape)),
      h("td", { class: "num" }, formatError(o.max_abs_error)), h("td", { class: "num" }, formatError(o.max_rel_error)),
      h("td", { class: "num muted" }, o.atol !== null && o.atol !== undefined ? `${o.atol} / ${o.rtol}` : ""),
      h("td", {}, verdict(o.passed ? "passed" : "failed"), o.message ? h("div", { class: "small" }, o.message) : null))));
  }
  return table(["sample", "sizes", "output", "shape", "max abs error", "max rel error", "atol / rtol", "result"], rows, { class: "verification" });
}

function verificationCard(v) {
  const rt = v.roundtrip;
  return card("Verification",
    h("p", { class: "muted" }, "Each sample runs the exported program and the original eager model on the same inputs; dynamic sizes are drawn at their min, their max and in between."),
    h("p", { class: "verification-verdict", "data-verdict": verdictOf(v) }, h("strong", {}, verdictText(v))),
    verificationTable(v),
    rt ? h("p", { "data-roundtrip": rt.status }, h("strong", {}, "Save → load round trip: "), verdict(rt.status), rt.bitwise_equal ? " outputs bitwise equal" : "", rt.reason ? ` (${rt.reason})` : "") : null);
}

/** A generation-ready export (report.generation): the cache, the encoder of an encoder-decoder model, and the program's greedy generation. */
function generationCard(g) {
  const e = g.encoder;
  return card("Generation",
    h("p", { class: "muted" }, `A static KV cache of ${g.max_cache_len} tokens (batch ${g.batch_size}) in the program: one method for prefill and decode, inputs ${g.inputs.join(", ")}.`),
    e ? h("p", { "data-encoder": e.artifact },
      h("strong", {}, "Encoder: "), h("code", {}, e.artifact), ` (${e.inputs.join(", ")} [${e.input_shape.join(", ")}] → last_hidden_state), run once per input; `,
      e.verification ? h("span", { "data-verdict": verdictOf(e.verification) }, verdictText(e.verification)) : "not verified",
      e.roundtrip ? `, round trip ${e.roundtrip.status}` : "") : null,
    g.check ? generationLine(g.check) : h("p", { class: "muted" }, "Not checked: verification is off."));
}

/** One greedy-generation check (report.generation.check, report.targets.<name>.generation). */
function generationLine(c) {
  const nearTie = !c.matched && generationPassed(c);
  return h("div", { class: "generation-check", "data-matched": String(c.matched), "data-passed": String(generationPassed(c)) },
    h("p", {}, h("strong", {}, c.matched
      ? `✓ ${c.max_new_tokens} tokens generated greedily from a ${c.prompt_tokens}-token prompt, equal to eager transformers' token for token`
      : nearTie
        ? `✓ equal to eager transformers' tokens up to a near tie: the first difference is where eager's own margin is within its rounding noise (see generation.check: within_noise, margin, noise)`
        : `✗ generates other tokens than eager transformers from token ${c.first_mismatch} on`)),
    h("p", { class: "small muted" }, "eager: ", h("code", {}, c.expected.join(" ")),
      c.matched ? null : h("span", {}, " · this: ", h("code", {}, c.generated.join(" ")))),
    c.runs?.length ? h("ol", { class: "generation-runs small", start: 2 }, c.runs.map(generationRun)) : null);
}

const PROMPTS = { second: "a second prompt", example: "the example prompt again" };

/** A later run of a generation check (generation.check.runs[]), restarted at position 0 on the same loaded artifact. */
function generationRun(r) {
  const passed = r.matched || r.within_noise === true;
  const what = r.matched ? "✓ equal to eager's tokens"
    : passed ? `✓ equal up to a near tie at token ${r.first_mismatch}`
      : `✗ other tokens than eager's from token ${r.first_mismatch} on`;
  return h("li", { "data-run": r.prompt, "data-matched": String(r.matched), "data-passed": String(passed) },
    `Restarted at position 0 with ${PROMPTS[r.prompt] || r.prompt}`,
    r.prompt_ids?.length ? h("span", {}, " (ids ", h("code", {}, r.prompt_ids.join(" ")), ")") : null,
    `: ${what}.`,
    r.matched ? null : h("span", { class: "muted" }, " eager: ", h("code", {}, r.expected.join(" ")), " · this: ", h("code", {}, r.generated.join(" "))));
}

/**
 * A link to one of the job's artifacts: its href is the API's address of the file; a click
 * downloads it as the Downloads buttons do (fetched with the API key when one is set).
 */
function artifactLink(job, name) {
  const link = h("a", { href: artifactUrl(job.id, name), download: name, class: "artifact-link", "data-artifact-link": name }, name);
  link.addEventListener("click", (event) => {
    event.preventDefault();
    downloadArtifact(job.id, name);
  });
  return link;
}

/**
 * Deployment targets (report.targets): per target its status, artifact, size, conversion time,
 * notes, its error when it failed, and its own verification table. Null when none was asked for.
 */
export function targetsCard(job, report) {
  const entries = Object.entries(report?.targets || {});
  if (!entries.length) return null;
  const order = Object.keys(TARGETS);
  entries.sort(([a], [b]) => (order.indexOf(a) + 1 || 99) - (order.indexOf(b) + 1 || 99) || a.localeCompare(b));
  const stored = new Map((job.artifacts || []).map((a) => [a.name, a]));
  const rows = entries.map(([name, t]) => {
    const size = t.size ?? stored.get(t.artifact)?.size;
    return h("tr", { "data-target": name, "data-status": t.status },
      h("td", {}, h("strong", {}, TARGETS[name]?.label || name), h("div", { class: "small muted" }, TARGETS[name]?.runtime || "")),
      h("td", {}, badge(t.status)),
      h("td", {}, t.artifact ? (stored.has(t.artifact) ? artifactLink(job, t.artifact) : h("code", {}, t.artifact)) : "—"),
      h("td", { class: "num", "data-field": "size" }, size === null || size === undefined ? "—" : formatBytes(size)),
      h("td", { class: "num", "data-field": "duration" }, formatSeconds(t.duration_s)),
      h("td", { "data-field": "verified", "data-verdict": verdictOf(t.verification) || "" }, !t.verification ? (t.generation ? verdict(generationPassed(t.generation) ? "passed" : "failed") : h("span", { class: "muted" }, "—"))
        : verdictOf(t.verification) === "partially_verified" ? h("span", { class: "verdict skip" }, verdictText(t.verification))
        : verdict(t.verification.passed === false ? "failed" : t.verification.passed ? "passed" : "skipped")));
  });
  const sections = entries.map(([name, t]) => h("section", { class: "target-detail", "data-target-detail": name },
    h("h3", {}, TARGETS[name]?.label || name, " ", badge(t.status)),
    t.error ? h("div", { class: "warn-line target-error", "data-code": t.error.code, "data-target": name },
      h("code", {}, t.error.code), " ", rich(t.error.message), t.error.hint ? h("div", { class: "hint" }, rich(t.error.hint)) : null) : null,
    t.notes?.length ? h("ul", { class: "notes" }, t.notes.map((n) => h("li", {}, rich(n)))) : null,
    t.generation ? generationLine(t.generation) : null,
    t.verification?.samples?.length ? verificationTable(t.verification)
      : t.status === "succeeded" && !t.generation ? h("p", { class: "muted" }, "Not verified.") : null,
    t.details && Object.keys(t.details).length
      ? h("details", {}, h("summary", {}, "Details"), h("pre", {}, JSON.stringify(t.details, null, 1))) : null));
  return card("Deployment targets",
    h("p", { class: "muted" }, "Artifacts converted from the exported program, each loaded by its own runtime and run on the same samples, with the same tolerances, as the program's verification."),
    table(["target", "status", "artifact", "size", "convert time", "verified"], rows, { class: "targets" }),
    sections);
}

/**
 * A VerificationReport's verdict: `verified`, `partially_verified` (no check failed, some
 * samples skipped), `failed` or `disabled`; derived from its samples for reports without one.
 */
export function verdictOf(v) {
  if (!v) return null;
  if (v.verdict) return v.verdict;
  if (!v.enabled) return "disabled";
  const samples = v.samples || [];
  if (v.passed === false || samples.some((s) => s.status === "failed")) return "failed";
  return samples.some((s) => s.status === "skipped") ? "partially_verified" : "verified";
}

/** "partially verified (k of n samples; m skipped)", or "verified (n samples)". */
export function verdictText(v) {
  const samples = v.samples || [];
  const skipped = v.skipped ?? samples.filter((s) => s.status === "skipped").length;
  const checked = v.checked ?? samples.length - skipped;
  const n = samples.length;
  const kind = verdictOf(v);
  if (kind === "partially_verified") return `partially verified (${checked} of ${n} samples; ${skipped} skipped)`;
  if (kind === "verified") return `verified (${n} sample${n === 1 ? "" : "s"})`;
  return kind === "failed" ? "verification failed" : "not verified";
}

function verdict(status) {
  const ok = status === "passed";
  const skipped = status === "skipped";
  return h("span", { class: `verdict ${ok ? "pass" : skipped ? "skip" : "fail"}` }, ok ? "✓ pass" : skipped ? "skipped" : "✗ fail");
}

function decompositionCard(d) {
  const nonCore = new Set(d.non_core_aten_ops || []);
  const ops = [...new Set([...Object.keys(d.ops_before || {}), ...Object.keys(d.ops_after || {})])].sort();
  const row = (op) => h("tr", { class: nonCore.has(op) ? "non-core" : "", "data-op": op },
    h("td", {}, h("code", {}, op)), h("td", { class: "num" }, String(d.ops_before?.[op] ?? "")), h("td", { class: "num" }, String(d.ops_after?.[op] ?? "")),
    h("td", {}, nonCore.has(op) ? "outside core ATen" : d.removed_ops?.includes(op) ? "decomposed" : d.added_ops?.includes(op) ? "introduced" : ""));
  return card("Decomposition",
    h("p", {}, `Mode `, h("code", {}, d.mode), d.preserve?.length ? ["; kept as requested: ", d.preserve.map((p) => h("code", {}, p))] : "", "."),
    nonCore.size
      ? h("p", { class: "warn-line" }, `${nonCore.size} op${nonCore.size > 1 ? "s" : ""} outside the core ATen set: a backend that only implements core ATen will not run this program as is.`)
      : h("p", { class: "ok-line" }, "Every op is in the core ATen set."),
    d.kept_after_failure?.length ? h("p", { class: "warn-line" }, "Kept undecomposed because decomposing them failed: ", d.kept_after_failure.map((p) => h("code", {}, p, " "))) : null,
    longTable(["op", "before", "after", ""], ops, row, { class: "decomposition" }));
}

function reexportCard(job, signature, navigate, suggested = null, examples = []) {
  // The sizes of the example inputs as loaded (report.inputs), not the program's symbolic ones: a dim shows 32, not its name.
  const loaded = new Map((examples || []).filter((e) => e.shape).map((e) => [e.path, e.shape]));
  const inputs = signature.inputs.filter((i) => i.kind === "user_input" && i.shape)
    .map((i) => ({ name: i.name, shape: loaded.get(i.pytree_path) || i.shape, dtype: i.dtype }));
  if (!inputs.length) return null;
  // An export without dynamic shapes: the engine's suggestion (report.tracing.dynamic_shapes.suggested) pre-fills the editor.
  const initial = signature.dynamic_shapes || suggested || null;
  const preview = h("pre", { id: "reexport-spec" }, initial ? JSON.stringify(initial) : "null");
  let spec = initial;
  const editor = dimensionEditor(inputs, (value) => {
    spec = value;
    preview.textContent = JSON.stringify(value);
  }, initial);
  const again = h("button", { type: "button", class: "secondary", id: "reexport" }, "Export again with these dynamic shapes");
  again.addEventListener("click", () => startAgain(job, navigate, { options: { dynamic_shapes: spec }, inputs_meta: inputs }));
  const note = !signature.dynamic_shapes && suggested
    ? h("p", { class: "muted", id: "suggested-note" }, "Pre-filled with the dimensions the engine suggests (batch, sequence length); not tried yet — export again to check them.")
    : null;
  return card("Dynamic shapes", h("p", { class: "muted" }, "The example inputs as this export saw them. Tick the sizes that may change; inputs that must have equal sizes share a name."), note, editor, preview, h("div", { class: "actions" }, again));
}
