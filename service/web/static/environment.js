// The workers' environment: torch and the libraries uploaded models can import, per queue,
// as each queue's latest worker found them when it started (GET /v1/environment).
import { h, fill, card, table, formatTime } from "./dom.js";
import { getEnvironment, ApiError } from "./api.js";

export function renderEnvironment(root) {
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  fill(root,
    h("h1", {}, "Environment"),
    h("p", { class: "muted" }, "What uploaded models can import on this server's workers. Name what your model needs in the ",
      h("code", {}, "requires"), " option (", h("code", {}, "transformers>=4.40"), "): a worker without it then fails the job at once with ",
      h("code", {}, "environment_mismatch"), ", and each report lists the libraries the model imported."),
    body);
  getEnvironment().then((data) => {
    if (!data.workers.length) {
      fill(body, h("p", { class: "muted", id: "no-workers" }, "No worker has described its environment yet: workers do when they start."));
      return;
    }
    fill(body, data.workers.map(renderWorker));
  }).catch((error) => {
    const code = error instanceof ApiError ? error.body.code : "internal_error";
    fill(body, h("p", { "data-code": code }, h("code", {}, code), " ", error.message));
  });
}

function loads(library) {
  if (library.version === null) return h("span", { class: "muted" }, "not installed");
  if (library.imports === true) return h("span", { class: "ok-line" }, "loads");
  if (library.imports === false) return h("span", { class: "error-line" }, "fails to load");
  return h("span", { class: "muted" }, "not checked");
}

function renderWorker(worker) {
  const env = worker.environment;
  const models = env.libraries.filter((lib) => lib.model_library);
  const others = env.libraries.filter((lib) => !lib.model_library);
  const rows = models.map((lib) => h("tr", { "data-library": lib.name, "data-imports": String(lib.imports) },
    h("td", {}, h("code", {}, lib.name)),
    h("td", { "data-field": "version" }, lib.version || "—"),
    h("td", {}, loads(lib)),
    h("td", { class: "small" }, lib.version !== null && lib.error ? h("code", {}, lib.error) : "")));
  const rest = others.map((lib) => h("tr", { "data-library": lib.name },
    h("td", {}, lib.name), h("td", {}, lib.version), h("td", { class: "small muted" }, lib.modules.join(", "))));
  const targets = (env.targets || []).map((t) => h("tr", { "data-target": t.name, "data-works": String(t.works) },
    h("td", {}, h("code", {}, t.name)),
    h("td", {}, t.works === true ? h("span", { class: "ok-line" }, "works")
      : t.works === false ? h("span", { class: "error-line" }, "does not work") : h("span", { class: "muted" }, "not checked")),
    h("td", { class: "small" }, t.missing.length ? `${t.missing.join(", ")} missing` : t.error ? h("code", {}, t.error) : "")));
  return card(`Queue ${worker.queue}`,
    h("p", { class: "muted" }, `Worker ${worker.hostname}, started ${formatTime(worker.recorded_at)} · Python ${env.python} · torch ${env.torch || "not installed"} · torchport ${env.torchport || "?"}`),
    table(["library", "version", "loads in a job", "why not"], rows, { class: "libraries", "data-queue": worker.queue }),
    targets.length ? table(["deployment target", "works here", "why not"], targets, { class: "targets", "data-queue": worker.queue }) : null,
    h("details", {}, h("summary", {}, `${others.length} more installed distributions`),
      table(["distribution", "version", "modules"], rest, { class: "distributions" })));
}
