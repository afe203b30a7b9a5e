// The report's warnings, each with whether it matters for this export. torchport's own
// warnings say what they mean; a `torch_warning` is torch's (or a converter's) raw text,
// so the page says what is known of it: a few texts torch prints for every model of a
// kind are recognised, and any of them is judged by what was checked after it was raised.
import { h, card, rich } from "./dom.js";
import { generationPassed } from "./profiles.js";

/** Raw torch warnings seen on exports that verify, with what they mean here. */
const KNOWN = [
  {
    id: "executorch_buffer_initial_state",
    pattern: /Mutation on a buffer in the model is detected\. ExecuTorch assumes buffers that are mutated in the graph have a meaningless initial state/,
    target: "executorch",
    why: "ExecuTorch saves a buffer the program writes (a static KV cache) without its initial values. A cache never reads a position before writing it, and positions past the current one are masked, so its initial values do not matter; a model that reads such a buffer before writing it would behave differently.",
  },
  {
    id: "dynamo_side_effects",
    pattern: /While compiling, we found certain side effects happened in the model\.forward/,
    target: null,
    why: "TorchDynamo saw forward set a Python global (transformers records its outputs through one). The exported program does not carry that global; its outputs are what the checks below compare.",
  },
];

/** The checks that ran after the warnings were raised: the program's verification and
 * generation check, and each target's (only `target`'s when one is named): whether all
 * passed, whether one failed. */
function checks(report, target) {
  const results = [];
  const v = report?.verification;
  if (!target) {
    if (v?.verdict === "verified" || (v?.verdict === undefined && v?.passed === true)) results.push(true);
    else if (v?.verdict === "failed" || v?.passed === false) results.push(false);
    if (report?.generation?.check) results.push(generationPassed(report.generation.check));
  }
  for (const [name, t] of Object.entries(report?.targets || {})) {
    if (target && name !== target) continue;
    if (t.status === "failed") results.push(false);
    if (t.verification) results.push(t.verification.passed !== false && t.verification.verdict !== "failed");
    if (t.generation) results.push(generationPassed(t.generation));
  }
  return { passed: results.length > 0 && results.every(Boolean), failed: results.some((r) => r === false) };
}

/**
 * Whether a warning matters for this export: `matters` false when every check after it
 * passed (for a known one, the checks of the artifact it is about), true when one failed,
 * null when nothing was checked; `known` the id of a recognised torch warning; `why` the
 * explanation shown.
 */
export function assessWarning(warning, report) {
  if (warning.code !== "torch_warning") return { matters: null, known: null, why: null };
  const known = KNOWN.find((k) => k.pattern.test(warning.message || "")) || null;
  const { passed, failed } = checks(report, known?.target || null);
  const scope = known?.target ? `the ${known.target} target` : "the export";
  const verdict = failed
    ? `A check of ${scope} failed: this warning may be why.`
    : passed
      ? `It did not change the result: ${scope} passed every check against eager PyTorch${report?.generation ? " (and generated the same tokens as eager transformers)" : ""}.`
      : `Nothing checked ${scope} after it: turn verification on to know whether it matters.`;
  return { matters: failed ? true : passed ? false : null, known: known?.id || null, why: known ? `${known.why} ${verdict}` : verdict };
}

export function warningsCard(report) {
  const warnings = report?.warnings || [];
  if (!warnings.length) return null;
  return card("Warnings", h("ul", { class: "warnings" }, warnings.map((w) => {
    const assessed = assessWarning(w, report);
    return h("li", { "data-code": w.code, "data-matters": assessed.matters === null ? "unknown" : String(assessed.matters), "data-known": assessed.known || "" },
      h("code", {}, w.code), " ", w.code === "torch_warning" ? h("span", { class: "muted" }, "torch said: ") : null, w.code === "torch_warning" ? h("q", {}, w.message) : rich(w.message),
      assessed.why ? h("div", { class: `assessment ${assessed.matters === false ? "ok-line" : assessed.matters ? "warn-line" : "muted"}` }, assessed.why) : null);
  })));
}
