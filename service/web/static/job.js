// A job: live stage progress from the event stream, elapsed time per stage, cancel; then the
// result or the failure once it finishes.
import { h, fill, card, badge, formatSeconds, formatTime } from "./dom.js";
import { getJob, followJob, cancelJob, getArtifactJson, ApiError } from "./api.js";
import { renderResult } from "./result.js";
import { renderFailure } from "./failure.js";
import { againButton } from "./again.js";

export const STAGES = ["loading", "tracing", "decomposing", "verifying", "serializing", "converting", "profiling"];
const STAGE_HELP = {
  loading: "importing your module, building the example inputs, running it once eagerly",
  tracing: "torch.export.export: recording the tensor operations with symbolic shapes",
  decomposing: "run_decompositions: lowering to the core ATen operator set",
  verifying: "running the exported program against eager PyTorch on sampled shapes",
  serializing: "torch.export.save, then loading it back in a fresh process",
  converting: "converting to the deployment targets asked for, each verified in its own runtime",
  profiling: "loading each artifact as a deployment would and timing it at 1 thread and at all of the worker's",
};

/** Whether a job went, or goes, through `stage`: always, except `converting` (only with targets) and `profiling` (option profile). */
function passes(job, stage) {
  if (job.error?.stage === stage || (job.stages || []).some((e) => e.stage === stage)) return true;
  const targets = Boolean(job.options?.targets?.length);
  if (stage === "converting") return targets;
  if (stage === "profiling") return job.options?.profile?.enabled ?? targets;
  return true;
}

/** The stages a job goes through: `converting` only when it asked for deployment targets, `profiling` when it profiles. */
export function stagesOf(job) {
  return STAGES.filter((stage) => passes(job, stage));
}

const TERMINAL = new Set(["succeeded", "failed", "canceled"]);

/**
 * The time left in a running stage, from its own progress: the latest fraction f strictly
 * between 0 and 1, reported t seconds into the stage, puts the whole stage at t / f.
 * Null before the stage reports any; `left` in seconds from `now` (ms), never below 0.
 */
export function stageEstimate(job, stage, now) {
  const events = (job.stages || []).filter((e) => e.stage === stage);
  if (!events.length) return null;
  const started = Date.parse(events[0].at);
  const last = [...events].reverse().find((e) => typeof e.fraction === "number" && e.fraction > 0 && e.fraction < 1);
  if (!last || Date.parse(last.at) <= started) return null;
  const total = (Date.parse(last.at) - started) / last.fraction;
  return { fraction: last.fraction, left: Math.max(0, (started + total - now) / 1000) };
}

/**
 * What a running stage's estimate says: a percentage and the time left (`data-left`, whole
 * seconds), or, once the stage has run past what its own progress predicted (`left` under
 * a second while it still runs), only the percentage and that it is taking longer
 * (`data-overdue`): never "0 ms left" for a stage that is not done.
 */
export function estimateLabel(estimate) {
  const percent = `${Math.round(estimate.fraction * 100)} %`;
  const left = Math.round(estimate.left);
  if (left < 1) return h("span", { class: "estimate", "data-overdue": "true" }, ` · ${percent}, taking longer than its progress so far suggested`);
  return h("span", { class: "estimate", "data-left": left }, ` · ${percent}, about ${formatSeconds(left)} left`);
}

/**
 * How the job was traced: once the report says (`report.tracing.strict_used`), the mode used,
 * which the engine may choose itself (a generation-ready checkpoint is always traced strict);
 * before that, what the options asked for.
 */
export function tracingFact(job, report) {
  const used = report?.tracing?.strict_used;
  if (used === true || used === false) return { source: "report", strict: used, text: used ? "traced strict" : "traced non-strict" };
  const asked = job.options?.strict;
  const text = asked === true ? "strict" : asked === "auto" ? "strict, then non-strict" : "non-strict";
  return { source: "options", strict: asked === true ? true : asked === "auto" ? "auto" : false, text };
}

/**
 * Where the job's dynamic shapes come from, once the report says (`report.tracing.dynamic_shapes`):
 * the options, the module's own `dynamic_shapes`, the checkpoint's task, or none (static).
 * Before that only the options are known: without them the module may still declare some.
 */
export function shapesFact(job, report) {
  const shapes = report?.tracing?.dynamic_shapes;
  const given = job.options?.dynamic_shapes;
  if (shapes?.source && (shapes.source !== "none" || report?.tracing?.attempts?.length)) {
    const texts = { options: "dynamic shapes given", module: "dynamic shapes from the module", checkpoint: "dynamic shapes for the task", none: "static shapes" };
    return { source: shapes.source, text: texts[shapes.source] || shapes.source };
  }
  if (given) return { source: "options", text: "dynamic shapes given" };
  return { source: "unknown", text: "the module's dynamic shapes, if any" };
}

/** Per stage: {state, started, ended} from the job's stage events (ISO times). */
export function stageTimeline(job) {
  const starts = new Map();
  let current = null;
  const order = [];
  for (const event of job.stages || []) {
    if (event.stage && !starts.has(event.stage)) {
      starts.set(event.stage, Date.parse(event.at));
      order.push(event.stage);
    }
    if (event.stage) current = event.stage;
  }
  const finished = job.finished_at ? Date.parse(job.finished_at) : null;
  const timeline = {};
  for (const stage of stagesOf(job)) {
    const index = order.indexOf(stage);
    if (index < 0) {
      timeline[stage] = { state: TERMINAL.has(job.status) ? "skipped" : "pending", started: null, ended: null };
      continue;
    }
    const next = order[index + 1];
    const ended = next ? starts.get(next) : finished;
    let state = "done";
    if (!next) {
      if (job.status === "running") state = "running";
      else if (job.status === "failed") state = (job.error?.stage || current) === stage ? "failed" : "done";
      else if (job.status === "canceled") state = "canceled";
    }
    if (job.status === "failed" && job.error?.stage === stage) state = "failed";
    timeline[stage] = { state, started: starts.get(stage), ended };
  }
  return timeline;
}

export function renderJob(root, id, navigate) {
  let job = null;
  let stop = null;
  let ticker = null;
  let report = null;
  const header = h("div", { class: "job-header" });
  const progress = h("ol", { class: "stages", id: "stages" });
  const cancel = h("button", { type: "button", class: "danger", id: "cancel" }, "Cancel");
  const notice = h("div", { class: "notice", hidden: true });
  const outcome = h("div", { id: "outcome" });
  fill(root, header, card("Progress", progress, h("div", { class: "actions" }, cancel), notice), outcome);

  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    cancel.textContent = "Canceling…";
    try {
      const answer = await cancelJob(id);
      if (TERMINAL.has(answer.status)) finish(answer);
    } catch (error) {
      cancel.disabled = false;
      cancel.textContent = "Cancel";
      showNotice(error);
    }
  });

  function showNotice(error) {
    notice.hidden = false;
    const body = error instanceof ApiError ? error.body : { code: "internal_error", message: String(error) };
    fill(notice, h("code", {}, body.code), " ", body.message);
  }

  function renderHeader() {
    const o = job.options;
    const shapes = shapesFact(job, report);
    const tracing = tracingFact(job, report);
    const facts = [
      job.model_name,
      `created ${formatTime(job.created_at)}`,
      h("span", { "data-fact": "tracing", "data-strict": String(tracing.strict), "data-source": tracing.source }, tracing.text),
      `decomposition: ${o.decomposition.mode}`,
      h("span", { "data-fact": "shapes", "data-shapes": shapes.source }, shapes.text),
      o.verify.enabled ? "verified" : "not verified",
      o.targets?.length ? `targets: ${o.targets.join(", ")}${o.targets_required ? " (required)" : ""}` : null,
      o.quantize?.scheme && o.quantize.scheme !== "none"
        ? h("span", { "data-fact": "quantize", "data-calibration": job.calibration_name || "" },
          `quantize: ${o.quantize.scheme}${job.calibration_name ? `, calibrated on ${job.calibration_name}` : ""}`)
        : null,
      o.device,
    ].filter(Boolean);
    fill(header,
      h("h1", {}, "Export ", h("code", { class: "job-id" }, id), " ", badge(job.status)),
      h("p", { class: "muted" }, ...facts.flatMap((fact, i) => (i ? [" · ", fact] : [fact])), job.cache_hit ? h("span", { class: "tag" }, "cache hit: an identical earlier export") : null),
    );
  }

  function renderProgress() {
    const timeline = stageTimeline(job);
    const now = Date.now();
    const durations = new Map((report?.stages || []).map((s) => [s.name, s.duration_s]));
    fill(progress, ...stagesOf(job).map((stage) => {
      const t = timeline[stage];
      const seconds = durations.has(stage) ? durations.get(stage) : t.started ? ((t.ended ?? now) - t.started) / 1000 : null;
      const last = [...(job.stages || [])].reverse().find((e) => e.stage === stage && e.message);
      const estimate = t.state === "running" ? stageEstimate(job, stage, now) : null;
      return h("li", { class: `stage stage-${t.state}`, "data-stage": stage, "data-state": t.state },
        h("span", { class: "dot", "aria-hidden": "true" }),
        h("span", { class: "name" }, stage),
        h("span", { class: "elapsed" }, t.state === "pending" || t.state === "skipped" ? (t.state === "skipped" ? "skipped" : "") : formatSeconds(seconds)),
        h("span", { class: "what muted" }, t.state === "running" && last?.message ? last.message : STAGE_HELP[stage],
          estimate ? estimateLabel(estimate) : null));
    }));
    const queued = job.status === "queued";
    if (queued) progress.prepend(h("li", { class: "stage stage-running", "data-stage": "queued" }, h("span", { class: "dot" }), h("span", { class: "name" }, "queued"), h("span", { class: "elapsed" }, formatSeconds((now - Date.parse(job.created_at)) / 1000)), h("span", { class: "what muted" }, "waiting for a worker")));
    cancel.hidden = TERMINAL.has(job.status);
  }

  async function finish(final) {
    job = final;
    if (stop) stop();
    clearInterval(ticker);
    renderHeader();
    renderProgress();
    fill(outcome, h("p", { class: "muted" }, "Loading the report…"));
    report = null;
    const names = new Set((job.artifacts || []).map((a) => a.name));
    try {
      report = names.has("report.json") ? await getArtifactJson(id, "report.json") : null;
    } catch (error) {
      showNotice(error);
    }
    renderHeader();
    renderProgress();
    if (job.status === "succeeded") {
      const [graph, signature] = await Promise.all([
        names.has("graph.json") ? getArtifactJson(id, "graph.json") : null,
        names.has("signature.json") ? getArtifactJson(id, "signature.json") : null,
      ]);
      renderResult(outcome, job, { report, graph, signature }, navigate);
    } else if (job.status === "canceled") {
      fill(outcome, card("Canceled", h("p", { "data-code": "canceled" }, "This export was canceled; nothing was produced."), againButton(job, navigate)));
    } else {
      renderFailure(outcome, job, report, navigate);
    }
  }

  getJob(id).then((first) => {
    job = first;
    renderHeader();
    renderProgress();
    if (TERMINAL.has(job.status)) {
      finish(job);
      return;
    }
    ticker = setInterval(renderProgress, 250);
    stop = followJob(id, {
      onStage(event) {
        if (job.stages.some((e) => e.at === event.at && e.status === event.status && e.stage === event.stage)) return;
        job.stages.push(event);
        if (event.stage) job.stage = event.stage;
        if (event.status === "running" || event.status === "started" || event.status === "progress") job.status = "running";
        renderHeader();
        renderProgress();
      },
      onJob: finish,
      onError: showNotice,
    });
  }).catch((error) => {
    fill(root, card("Job not available", h("p", { "data-code": error.body?.code }, h("code", {}, error.body?.code || "error"), " ", error.message)));
  });

  return () => {
    if (stop) stop();
    clearInterval(ticker);
  };
}
