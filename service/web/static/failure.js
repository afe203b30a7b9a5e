// A failed job: the error code, message and hint; the user's source around the failing line;
// suggested dynamic-shape fixes as copyable JSON; ExportDB cases; the draft-export issues.
import { h, fill, card, table, copyButton, rich } from "./dom.js";
import { sourceOf } from "./session.js";
import { againButton, startAgain } from "./again.js";
import { targetsCard } from "./result.js";
import { applySuggestedFixes, dimensionEditor } from "./dynamic_shapes.js";
import { getUploadText } from "./api.js";

const EXPORTDB = "https://pytorch.org/docs/main/generated/exportdb/index.html#";
const CONTEXT_LINES = 6;

/** What each error code means for someone new to torch.export (contract §4). */
const EXPLAIN = {
  invalid_request: "The options or files of the request were not accepted.",
  upload_too_large: "A file is larger than this server accepts.",
  environment_mismatch: "The workers do not have the libraries (or versions) your `requires` option names, so your code was not run.",
  model_import_failed: "Importing your file raised an error, before export started.",
  model_not_found: "The file has no `model` (or `get_model`, or the symbol you named) that can be exported.",
  invalid_inputs: "The example-inputs file could not be read.",
  weights_mismatch: "The weights file does not match the model's parameters.",
  eager_run_failed: "Your model raised when run normally on the example inputs, so there is nothing to export yet.",
  unsupported_python: "Tracing met a Python feature torch.export cannot record.",
  data_dependent: "The code makes a decision based on the values inside a tensor. torch.export records one program for all inputs, so it cannot follow a branch that depends on data.",
  dynamic_shape_violation: "The sizes you marked as dynamic conflict with what the code assumes about them.",
  missing_fake_kernel: "A custom operator has no fake (meta) implementation, so export cannot work out its output shapes.",
  decomposition_failed: "Lowering the program to core ATen ops failed.",
  verification_failed: "The exported program gives different results than your eager model.",
  serialization_failed: "Saving the program, or loading it back, failed.",
  non_portable_op: "The program calls an operator that a library (or your code) registers when it is imported, so a process that has only torch cannot load it.",
  quantization_inaccurate: "A quantized deployment target is less accurate against your float model than the budget you set (quantize.min_cosine or quantize.max_abs), and `targets_required` makes that fail the job.",
  timeout: "The export took longer than its time limit.",
  out_of_memory: "The export used more memory than its limit.",
  target_failed: "The program exported, but converting it to a deployment target you asked for (ONNX, AOTInductor, ExecuTorch) or running that target against eager PyTorch failed, and `targets_required` makes that fail the job.",
  disk_quota_exceeded: "Your code wrote more to disk (files, their number, or one file's size) than a job may hold.",
  sandbox_violation: "Your code tried something the sandbox does not allow (network, running programs, …).",
  canceled: "The export was canceled.",
  internal_error: "Something went wrong inside torchport; this is our bug, not yours.",
};

/** ExportDB's anchor for a case: underscores become dashes. */
export function exportdbUrl(name) {
  return EXPORTDB + name.replace(/_/g, "-");
}

export function renderFailure(root, job, report, navigate) {
  const error = report?.error || job.error || { code: "internal_error", message: "The job failed without an error body." };
  const sections = [
    card("Export failed",
      h("div", { class: "error-head" }, h("code", { class: "error-code", id: "error-code", "data-code": error.code }, error.code),
        error.stage ? h("span", { class: "muted" }, ` during ${error.stage}`) : null),
      EXPLAIN[error.code] ? h("p", { class: "explain" }, rich(EXPLAIN[error.code])) : null,
      h("p", { class: "error-message", id: "error-message" }, rich(error.message)),
      error.hint ? h("div", { class: "hint-box", id: "error-hint" }, h("strong", {}, "How to fix it: "), rich(error.hint)) : null,
      error.code === "environment_mismatch" || error.details?.missing_module
        ? h("p", {}, h("a", { href: "#/environment", id: "environment-link" }, "What the workers have installed")) : null,
      h("div", { class: "actions" }, againButton(job, navigate), optionalTargetsButton(job, error, navigate))),
    error.location ? sourceCard(job, error.location) : null,
    targetsCard(job, report),
    fixesCard(job, error, report, navigate),
    shapesEditorCard(job, error, report, navigate),
    error.exportdb?.length ? exportdbCard(error.exportdb) : null,
    report?.draft_export?.length ? draftCard(report.draft_export) : null,
    report?.tracing?.attempts?.length ? attemptsCard(report.tracing.attempts) : null,
    detailsCard(error),
  ];
  fill(root, ...sections.filter(Boolean));
}

/** For a job a required target failed: export again with the targets optional. */
function optionalTargetsButton(job, error, navigate) {
  if (error.code !== "target_failed" || !job.options?.targets_required) return null;
  const button = againButton(job, navigate, { options: { targets_required: false } }, "Export again, keeping the job when a target fails");
  button.id = "reexport-optional-targets";
  return button;
}

function sourceCard(job, location) {
  const line = location.line;
  const source = h("pre", { class: "source", id: "source", "data-source": "error" });
  const note = h("p", { class: "muted small", id: "source-note" });
  const showLines = (rows) => fill(source, rows.map(([n, text]) =>
    h("div", { class: n === line ? "src-line highlight" : "src-line", "data-line": n }, h("span", { class: "ln" }, String(n ?? "")), h("span", { class: "code" }, text ?? ""))));
  /** The lines around the failing one from the whole file; false when the line is not in it. */
  const showFile = (text, from) => {
    const all = text.split("\n");
    if (!line || line > all.length) return false;
    const rows = [];
    for (let n = Math.max(1, line - CONTEXT_LINES); n <= Math.min(all.length, line + CONTEXT_LINES); n += 1) rows.push([n, all[n - 1]]);
    showLines(rows);
    source.dataset.source = from;
    note.hidden = true;
    return true;
  };
  const onlyTheLine = (why) => {
    fill(note, why);
    note.hidden = false;
  };
  showLines([[line, location.code || ""]]);
  const local = sourceOf(job.id);
  if (local && (!location.file || location.file.endsWith(local.name) || local.name.endsWith(location.file)) && showFile(local.text, "tab")) {
    // this tab uploaded it
  } else if (uploadedPath(job, location) !== undefined) {
    onlyTheLine("Loading your source…");
    getUploadText(job.id, uploadedPath(job, location))
      .then((text) => showFile(text, "upload") || onlyTheLine("Only the failing line is shown: the uploaded file has no such line."))
      .catch((error) => onlyTheLine(`Only the failing line is shown: the uploaded file could not be read (${error.body?.code || "error"}).`));
  } else {
    onlyTheLine("Only the failing line is shown: it is not in a file this job uploaded.");
  }
  return card("Where in your code",
    h("p", {}, h("code", {}, `${location.file || "?"}:${line ?? "?"}`)),
    source, note);
}

/**
 * Where the failing file is among the job's uploads: null for the .py model itself, the path
 * inside the zip for a zip model, undefined when it is not an uploaded file we can ask for.
 */
function uploadedPath(job, location) {
  const name = job.model_name;
  if (!name || !location.line) return undefined;
  if (name.toLowerCase().endsWith(".zip")) return location.file || undefined;
  return !location.file || location.file === name ? null : undefined;
}

/** Top-level tensor inputs with a parameter name: what the dynamic-shapes JSON can key. */
export function editableInputs(inputs) {
  const top = /^(?:args\[\d+\]|kwargs\['[^']*'\])$/;
  const seen = new Set();
  return (inputs || []).filter((i) => i.name && i.shape && top.test(i.path) && !seen.has(i.name) && seen.add(i.name))
    .map((i) => ({ name: i.name, shape: i.shape, dtype: i.dtype }));
}

/** Failures whose fix may be other dynamic shapes: torch's refusal of the spec, or a mistake in its JSON. */
export function shapeRelated(error) {
  return error.code === "dynamic_shape_violation"
    || (error.code === "invalid_request" && error.stage === "tracing" && typeof error.details?.path === "string");
}

/**
 * What the dimension editor starts from: the spec the job asked for, else, only for a
 * shape-related failure, the one proposed from the example inputs; `from` says which.
 */
export function editorSpec(job, error, report) {
  const own = report?.tracing?.dynamic_shapes?.requested ?? job.options?.dynamic_shapes ?? null;
  const proposed = shapeRelated(error) ? report?.tracing?.dynamic_shapes?.suggested ?? null : null;
  const usable = (spec) => spec && typeof spec === "object" && !Array.isArray(spec);
  if (usable(own)) return { spec: own, from: "requested" };
  if (usable(proposed)) return { spec: proposed, from: "suggested" };
  return { spec: null, from: "none" };
}

function shapesEditorCard(job, error, report, navigate) {
  const inputs = editableInputs(report?.inputs);
  if (!inputs.length || !error.stage || error.stage === "loading") return null;
  const start = editorSpec(job, error, report);
  let spec = start.spec;
  const preview = h("pre", { id: "reexport-spec" }, JSON.stringify(spec));
  const editor = dimensionEditor(inputs, (value) => {
    spec = value;
    preview.textContent = JSON.stringify(value);
  }, spec);
  const again = h("button", { type: "button", class: "secondary", id: "reexport" }, "Export again with these dynamic shapes");
  again.addEventListener("click", () => {
    again.disabled = true;
    startAgain(job, navigate, { options: { dynamic_shapes: spec }, inputs_meta: inputs });
  });
  const shown = card("Dynamic shapes",
    h("p", { class: "muted" }, "The example inputs as this export loaded them. Tick the sizes that may change (inputs that must have equal sizes share a name) and export again."),
    editor, preview, h("div", { class: "actions" }, again));
  shown.dataset.prefill = start.from;
  return shown;
}

function fixesCard(job, error, report, navigate) {
  const details = error.details || {};
  const fixes = details.suggested_fixes || [];
  if (error.code !== "dynamic_shape_violation" && !fixes.length) return null;
  const requested = report?.tracing?.dynamic_shapes?.requested ?? job.options.dynamic_shapes;
  const json = applySuggestedFixes(requested, fixes);
  const parts = [];
  if (details.violations?.length) parts.push(h("ul", {}, details.violations.map((v) => h("li", {}, v))));
  if (fixes.length) {
    const text = fixes.join("\n");
    parts.push(h("p", {}, "torch suggests:"), h("pre", { id: "suggested-fixes" }, text), copyButton(text, "Copy"));
  }
  if (json) {
    const text = JSON.stringify(json, null, 1);
    const use = h("button", { type: "button", class: "secondary" }, "Use this spec and export again");
    use.addEventListener("click", () => startAgain(job, navigate, { options: { dynamic_shapes: json } }));
    parts.push(h("p", {}, "As dynamic-shapes JSON:"), h("pre", { id: "suggested-spec", "data-json": "true" }, text), h("div", { class: "actions" }, copyButton(text, "Copy JSON"), use));
  }
  if (!fixes.length && !json) parts.push(h("p", { class: "muted" }, "torch gave no fix for this; mark fewer dimensions dynamic, or widen their ranges."));
  return card("Dynamic-shape fixes", ...parts);
}

function exportdbCard(cases) {
  return card("Related ExportDB examples",
    h("p", { class: "muted" }, "ExportDB shows, for each case, code that fails or passes torch.export and how to write it so it exports."),
    h("ul", { class: "exportdb" }, cases.map((name) => h("li", {}, h("a", { href: exportdbUrl(name), target: "_blank", rel: "noopener", "data-case": name }, name)))));
}

function draftCard(issues) {
  return card("All issues found by draft export",
    h("p", { class: "muted" }, "torch.export.draft_export kept going past the first error; fix these together."),
    table(["type", "where", "what", "fix"], issues.map((i) => h("tr", { "data-type": i.type },
      h("td", {}, h("code", {}, i.type)),
      h("td", {}, i.location ? [h("code", {}, `${i.location.file}:${i.location.line}`), h("div", { class: "small muted" }, i.location.code || "")] : "—"),
      h("td", {}, rich(i.message)), h("td", {}, rich(i.hint))))));
}

function attemptsCard(attempts) {
  return card("Tracing attempts", table(["mode", "dynamic shapes", "result", "seconds"], attempts.map((a) => h("tr", {},
    h("td", {}, a.strict ? "strict" : "non-strict"), h("td", {}, h("code", {}, a.dynamic_shapes ? JSON.stringify(a.dynamic_shapes) : "none")),
    h("td", {}, a.succeeded ? "ok" : h("code", {}, a.error?.code || "failed")), h("td", { class: "num" }, a.duration_s.toFixed(2))))));
}

function detailsCard(error) {
  if (!error.details || !Object.keys(error.details).length) return null;
  return h("details", { class: "card" }, h("summary", {}, "Error details (JSON)"), h("pre", {}, JSON.stringify(error, null, 1)), copyButton(JSON.stringify(error, null, 1), "Copy error JSON"));
}
