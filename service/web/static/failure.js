// A failed job: the error code, message and hint; the user's source around the failing line;
// suggested dynamic-shape fixes as copyable JSON; ExportDB cases; the draft-export issues.
import { h, fill, card, table, copyButton, rich } from "./dom.js";
import { sourceOf } from "./session.js";
import { againButton, startAgain } from "./job.js";
import { applySuggestedFixes } from "./dynamic_shapes.js";

const EXPORTDB = "https://pytorch.org/docs/main/generated/exportdb/index.html#";
const CONTEXT_LINES = 6;

/** What each error code means for someone new to torch.export (contract §4). */
const EXPLAIN = {
  invalid_request: "The options or files of the request were not accepted.",
  upload_too_large: "A file is larger than this server accepts.",
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
  timeout: "The export took longer than its time limit.",
  out_of_memory: "The export used more memory than its limit.",
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
      h("div", { class: "actions" }, againButton(job, navigate))),
    error.location ? sourceCard(job, error.location) : null,
    fixesCard(job, error, report, navigate),
    error.exportdb?.length ? exportdbCard(error.exportdb) : null,
    report?.draft_export?.length ? draftCard(report.draft_export) : null,
    report?.tracing?.attempts?.length ? attemptsCard(report.tracing.attempts) : null,
    detailsCard(error),
  ];
  fill(root, ...sections.filter(Boolean));
}

function sourceCard(job, location) {
  const source = sourceOf(job.id);
  const line = location.line;
  let lines;
  let note = null;
  if (source && (!location.file || location.file.endsWith(source.name) || source.name.endsWith(location.file))) {
    const all = source.text.split("\n");
    const first = Math.max(1, (line ?? 1) - CONTEXT_LINES);
    const last = Math.min(all.length, (line ?? 1) + CONTEXT_LINES);
    lines = [];
    for (let n = first; n <= last; n += 1) lines.push([n, all[n - 1]]);
  } else {
    lines = [[line, location.code || ""]];
    note = "Only the failing line is shown: the API does not serve uploaded files back, and this browser tab did not upload this one.";
  }
  return card("Where in your code",
    h("p", {}, h("code", {}, `${location.file || "?"}:${line ?? "?"}`)),
    h("pre", { class: "source", id: "source" }, lines.map(([n, text]) =>
      h("div", { class: n === line ? "src-line highlight" : "src-line", "data-line": n }, h("span", { class: "ln" }, String(n ?? "")), h("span", { class: "code" }, text ?? "")))),
    note ? h("p", { class: "muted small" }, note) : null);
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
