// The jobs list: recent jobs (the API's job summaries) with status, a status filter and
// cursor pagination.
import { h, fill, card, table, badge, formatTime, formatSeconds } from "./dom.js";
import { listJobs, ApiError } from "./api.js";

const STATUSES = ["", "queued", "running", "succeeded", "failed", "canceled"];
const PAGE = 20;

export function renderJobs(root, params) {
  const status = params.get("status") || "";
  const cursor = params.get("cursor") || "";
  const trail = (params.get("trail") || "").split(",").filter(Boolean);
  const filter = h("select", { id: "status-filter", "aria-label": "status" }, STATUSES.map((s) => h("option", { value: s, selected: s === status }, s || "all statuses")));
  filter.addEventListener("change", () => { location.hash = `#/jobs${filter.value ? `?status=${filter.value}` : ""}`; });
  const body = h("div", {}, h("p", { class: "muted" }, "Loading…"));
  const refresh = h("button", { type: "button", class: "small" }, "Refresh");
  refresh.addEventListener("click", () => renderJobs(root, params));
  fill(root, h("h1", {}, "Jobs"), h("div", { class: "toolbar" }, h("label", {}, "Show ", filter), refresh), card("Recent exports", body));

  listJobs({ status: status || undefined, cursor: cursor || undefined, limit: PAGE }).then((page) => {
    if (!page.items.length) {
      fill(body, h("p", { class: "muted", id: "no-jobs" }, status ? `No ${status} jobs.` : "No jobs yet. ", h("a", { href: "#/" }, "Export a model")));
      return;
    }
    const rows = page.items.map((job) => {
      const seconds = job.finished_at && job.started_at ? (Date.parse(job.finished_at) - Date.parse(job.started_at)) / 1000 : null;
      return h("tr", { "data-job": job.id, "data-status": job.status },
        h("td", {}, h("a", { href: `#/jobs/${job.id}` }, h("code", {}, job.id.slice(0, 8)))),
        h("td", { class: "model-name", "data-field": "model_name" }, job.model_name || "—"),
        h("td", {}, badge(job.status), job.cache_hit ? h("span", { class: "tag" }, "cache") : null),
        h("td", {}, job.stage || ""),
        h("td", {}, job.error ? h("code", { "data-code": job.error.code }, job.error.code) : ""),
        h("td", { "data-field": "targets" }, (job.targets || []).join(", ") || "—"),
        h("td", {}, formatTime(job.created_at)),
        h("td", { class: "num" }, formatSeconds(seconds)));
    });
    const nav = h("div", { class: "pager" });
    const base = `#/jobs?${status ? `status=${status}&` : ""}`;
    if (cursor) {
      const previous = trail.slice(0, -1);
      const back = trail[trail.length - 1] || "";
      nav.append(h("a", { href: `${base}${back ? `cursor=${encodeURIComponent(back)}&` : ""}trail=${previous.join(",")}`, id: "previous-page" }, "← Newer"));
    }
    if (page.next_cursor) {
      nav.append(h("a", { href: `${base}cursor=${encodeURIComponent(page.next_cursor)}&trail=${[...trail, cursor].map(encodeURIComponent).join(",")}`, id: "next-page" }, "Older →"));
    }
    fill(body, table(["job", "model", "status", "stage", "error", "targets", "created", "took"], rows, { id: "jobs-table" }), nav);
  }).catch((error) => {
    const code = error instanceof ApiError ? error.body.code : "internal_error";
    fill(body, h("p", { "data-code": code }, h("code", {}, code), " ", error.message));
  });
}
