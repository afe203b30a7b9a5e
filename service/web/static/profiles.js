// The job's artifacts side by side (report.profile): one table, best deployable choice first,
// and a chart of latency against size (inline SVG). The CLI summary prints the same table,
// sorted the same way (torchport/artifact_table.py).
import { h, card, table, formatBytes } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
const RANK = { verified: 0, partially_verified: 1 };
const LABELS = { eager: "eager (reference)", program: "program.pt2", onnx: "ONNX", aoti: "AOTInductor", executorch: "ExecuTorch" };

/** p50 (ms) of a profiled artifact at `threads`, or null. */
function p50(profile, threads) {
  const found = (profile.latency || []).find((l) => l.threads === threads);
  return found ? found.p50_ms : null;
}

/** `verified`, `partially_verified`, `failed`, `disabled`, `not verified`, or `reference` (eager). */
function verdictFor(report, profile) {
  if (profile.kind === "eager") return "reference";
  if (profile.kind === "target") {
    const target = report.targets?.[profile.name];
    if (!target?.verification && target?.generation) return generationPassed(target.generation) ? "verified" : "failed";
    return target?.verification?.verdict || "not verified";
  }
  return report.verification?.verdict || "not verified";
}

/**
 * A quantized artifact's accuracy against float and whether it is within the budget, from
 * report.quantization.targets[name] (keyed by target name as report.targets is): the lowest
 * cosine over its outputs (and top-1 agreement), else tokens matched for generation, else the
 * largest abs error. Null when the job was not quantized, or this artifact was not.
 */
/** A generation check's verdict: equal tokens, or a first difference within the dtype's
 * noise (`passed`; reports without it: `matched`). */
export function generationPassed(check) {
  return check.passed ?? check.matched === true;
}

export function accuracyOf(report, name) {
  const entry = report?.quantization?.targets?.[name];
  if (!entry || typeof entry !== "object") return null;
  const passed = typeof entry.passed === "boolean" ? entry.passed : null;
  if (entry.measured === false) return { text: "not measured", passed: null };
  const cosines = (entry.outputs || []).map((o) => o?.cosine).filter((c) => typeof c === "number");
  const cosine = entry.cosine ?? (cosines.length ? Math.min(...cosines) : null);
  if (typeof cosine === "number") {
    const top1 = typeof entry.top1_agreement === "number" ? `, top-1 ${Math.round(entry.top1_agreement * 100)}%` : "";
    return { text: `cosine ${cosine.toFixed(4)}${top1}`, passed };
  }
  if (entry.generation && "matched" in entry.generation) return { text: `${entry.generation.matched}/${entry.generation.max_new_tokens} tokens`, passed };
  if (typeof entry.max_abs_error === "number") return { text: `max abs ${entry.max_abs_error.toExponential(2)}`, passed };
  return { text: null, passed };
}

/** The profiled artifacts of `report`, best deployable choice first, the eager reference last. */
export function artifactRows(report) {
  const profile = report?.profile;
  if (!profile) return [];
  const threads = profile.machine.threads;
  const rows = (profile.artifacts || []).map((a) => ({
    profile: a,
    verdict: verdictFor(report, a),
    accuracy: accuracyOf(report, a.name),
    p50One: p50(a, 1),
    p50All: p50(a, threads),
  }));
  const key = (r) => [r.profile.kind === "eager" ? 1 : 0, RANK[r.verdict] ?? 2, r.accuracy?.passed === false ? 1 : 0,
    r.p50All === null ? 1 : 0, r.p50All ?? 0, r.profile.size ?? 0];
  return rows.sort((a, b) => {
    const [x, y] = [key(a), key(b)];
    for (let i = 0; i < x.length; i += 1) if (x[i] !== y[i]) return x[i] - y[i];
    return 0;
  });
}

function ms(value) {
  if (value === null || value === undefined) return "—";
  if (value >= 1000) return `${(value / 1000).toFixed(2)} s`;
  return value < 10 ? `${value.toFixed(3)} ms` : `${value.toFixed(1)} ms`;
}

/** The sort order, as the page says it under the table. */
function orderText(threads, quantized) {
  return `Sorted by: verified first, ${quantized ? "then those within the accuracy budget, " : ""}then p50 latency at ${threads} threads, then size. The eager model is the reference, last.`;
}

/**
 * Where static int8 took its activation ranges from (report.quantization.calibration_source:
 * the job's calibration upload, or the example and the verification samples), or null.
 */
function calibrationText(quantization) {
  const source = quantization?.calibration_source;
  if (!source) return null;
  const n = quantization.calibration_samples;
  const count = typeof n === "number" ? `${n} ` : "";
  const text = source === "upload"
    ? `${quantization.scheme} calibrated on ${count}uploaded samples (the job's calibration file).`
    : `${quantization.scheme} calibrated on ${count}verification samples (the example and the verification samples).`;
  return h("p", { class: "small muted", "data-calibration": source, "data-samples": typeof n === "number" ? String(n) : "" }, text);
}

/**
 * The artifacts card (report.profile): a table of artifacts × (size, p50 at 1 thread and at the
 * worker's threads, load time, memory added, verified, accuracy vs float when quantized) and the
 * chart of latency against size. Null when the job was not profiled.
 */
export function artifactsCard(report) {
  const rows = artifactRows(report);
  if (!rows.length) return null;
  const { machine } = report.profile;
  const threads = machine.threads;
  const quantized = rows.some((r) => r.accuracy);
  const columns = ["artifact", "size", "p50 1 thread", `p50 ${threads} threads`, "load", "memory added", "verified", ...(quantized ? ["accuracy vs float"] : [])];
  const body = rows.map((r, index) => {
    const a = r.profile;
    const verdict = a.status === "measured" ? r.verdict : a.status;
    return h("tr", { "data-profile": a.name, "data-rank": String(index), "data-status": a.status, class: index === 0 ? "best" : "" },
      h("td", {}, h("strong", {}, LABELS[a.name] || a.name), a.artifact ? h("div", { class: "small muted" }, a.artifact) : null),
      h("td", { class: "num", "data-field": "size" }, a.size === null || a.size === undefined ? "—" : formatBytes(a.size)),
      h("td", { class: "num", "data-field": "p50-1" }, ms(r.p50One)),
      h("td", { class: "num", "data-field": "p50-all" }, ms(r.p50All)),
      h("td", { class: "num", "data-field": "load" }, a.load_s === null || a.load_s === undefined ? "—" : ms(a.load_s * 1000)),
      h("td", { class: "num", "data-field": "memory", title: a.peak_rss_mb ? `the job's process peaked at ${a.peak_rss_mb} MB meanwhile` : "" },
        a.added_rss_mb === null || a.added_rss_mb === undefined ? "—" : `+${a.added_rss_mb.toFixed(1)} MB`),
      h("td", { "data-field": "verified", "data-verdict": verdict, title: a.error || "" }, verdict.replace("_", " ")),
      quantized ? h("td", { "data-field": "accuracy", "data-passed": r.accuracy ? String(r.accuracy.passed) : "" }, r.accuracy?.text || "—") : null);
  });
  const isa = machine.isa?.length ? machine.isa.join(", ") : "no vector ISA reported";
  return card("Artifacts",
    h("p", { class: "muted" }, `Each artifact loaded as a deployment loads it and run on the example inputs on the worker: up to ${report.profile.runs} timed runs after ${report.profile.warmup} warm-up, at 1 thread and at ${threads}.`),
    table(columns, body, { class: "artifacts" }),
    h("p", { class: "small muted", "data-order": "verified,p50" }, orderText(threads, quantized)),
    quantized ? calibrationText(report.quantization) : null,
    h("p", { class: "small muted", "data-machine": machine.cpu || machine.architecture },
      `Measured on ${machine.cpu || machine.architecture} (${isa}; torch ${machine.torch_capability || "default"} kernels), ${threads} threads${machine.cpus ? ` of ${machine.cpus} CPUs` : ""}.`),
    latencyChart(rows, threads));
}

/** Tick values of a log10 axis from `lo` to `hi`: the powers of ten inside, or both ends when fewer than two. */
function ticks(lo, hi) {
  const decades = [];
  for (let e = Math.ceil(lo); e <= Math.floor(hi); e += 1) decades.push(10 ** e);
  if (decades.length >= 2) return decades;
  const pad = 0.1 * (hi - lo);
  return [10 ** (lo + pad), 10 ** (hi - pad)].map((v) => Number(v.toPrecision(2)));
}

/** Latency (p50, log scale) against size on disk (log scale): one point per artifact and thread count. */
export function latencyChart(rows, threads) {
  const points = [];
  for (const r of rows) {
    if (r.profile.size === null || r.profile.size === undefined) continue;
    if (r.p50All !== null) points.push({ row: r, threads, p50: r.p50All, filled: true });
    if (r.p50One !== null && threads !== 1) points.push({ row: r, threads: 1, p50: r.p50One, filled: false });
  }
  if (!points.length) return null;
  const eager = rows.find((r) => r.profile.kind === "eager")?.p50All ?? null;
  const [width, height, left, right, top, bottom] = [560, 260, 64, 120, 12, 40];
  const sizes = points.map((p) => p.row.profile.size);
  const latencies = points.map((p) => p.p50).concat(eager === null ? [] : [eager]);
  const range = (values) => {
    let lo = Math.log10(Math.min(...values));
    let hi = Math.log10(Math.max(...values));
    if (hi - lo < 0.5) [lo, hi] = [lo - 0.25, hi + 0.25];
    return [lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo)];
  };
  const [xLo, xHi] = range(sizes);
  const [yLo, yHi] = range(latencies);
  const x = (size) => left + ((Math.log10(size) - xLo) / (xHi - xLo)) * (width - left - right);
  const y = (p) => height - bottom - ((Math.log10(p) - yLo) / (yHi - yLo)) * (height - top - bottom);
  const el = (tag, attrs, ...children) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  };
  const svg = el("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "latency-chart", "data-chart": "latency-size", "aria-label": "p50 latency against size on disk" });
  svg.append(el("line", { x1: left, y1: height - bottom, x2: width - right, y2: height - bottom, class: "axis" }),
    el("line", { x1: left, y1: top, x2: left, y2: height - bottom, class: "axis" }));
  for (const value of ticks(xLo, xHi)) {
    svg.append(el("text", { x: x(value), y: height - bottom + 14, class: "tick", "text-anchor": "middle" }, formatBytes(Math.round(value))));
  }
  for (const value of ticks(yLo, yHi)) {
    svg.append(el("text", { x: left - 6, y: y(value) + 4, class: "tick", "text-anchor": "end" }, ms(value)));
  }
  svg.append(el("text", { x: (left + width - right) / 2, y: height - 6, class: "axis-label", "text-anchor": "middle" }, "size on disk (log)"),
    el("text", { x: 12, y: (top + height - bottom) / 2, class: "axis-label", "text-anchor": "middle", transform: `rotate(-90 12 ${(top + height - bottom) / 2})` }, "p50 latency (log)"));
  if (eager !== null) {
    svg.append(el("line", { x1: left, y1: y(eager), x2: width - right, y2: y(eager), class: "reference", "data-reference": "eager" }),
      el("text", { x: width - right + 4, y: y(eager) + 4, class: "tick" }, `eager ${ms(eager)}`));
  }
  for (const p of points) {
    const a = p.row.profile;
    const dot = el("circle", { cx: x(a.size), cy: y(p.p50), r: 5, class: p.filled ? "point" : "point hollow", "data-point": a.name, "data-threads": p.threads, "data-size": a.size, "data-p50": p.p50 },
      el("title", {}, `${LABELS[a.name] || a.name}: ${formatBytes(a.size)}, p50 ${ms(p.p50)} at ${p.threads} thread${p.threads === 1 ? "" : "s"}`));
    svg.append(dot);
    if (p.filled) svg.append(el("text", { x: x(a.size) + 8, y: y(p.p50) - 6, class: "point-label" }, LABELS[a.name] || a.name));
  }
  return h("figure", { class: "latency-chart" }, svg,
    h("figcaption", { class: "small muted" }, `p50 latency against size on disk, both log scales: filled at ${threads} threads, hollow at 1 thread; the dashed line is the eager model. Lower left is smaller and faster.`));
}
