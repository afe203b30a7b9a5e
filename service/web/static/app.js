// The single-page app: a hash router over the upload form, job pages, jobs list, the
// workers' environment and help.
import { h, fill, card } from "./dom.js";
import { apiKey, setApiKey } from "./api.js";
import { renderUpload } from "./upload.js";
import { renderJob } from "./job.js";
import { renderJobs } from "./jobs.js";
import { renderEnvironment } from "./environment.js";

const app = document.getElementById("app");
const banner = document.getElementById("banner");
let leave = null;

function navigate(hash) {
  if (location.hash === hash) route();
  else location.hash = hash;
}

function route() {
  if (leave) leave();
  leave = null;
  banner.hidden = true;
  const [path, query] = (location.hash.slice(1) || "/").split("?");
  const params = new URLSearchParams(query || "");
  const job = /^\/jobs\/([^/]+)$/.exec(path);
  const section = path.startsWith("/jobs") ? "jobs" : path === "/environment" ? "environment" : "upload";
  for (const link of document.querySelectorAll("[data-nav]")) {
    link.classList.toggle("active", link.dataset.nav === section);
  }
  if (job) leave = renderJob(app, decodeURIComponent(job[1]), navigate);
  else if (path === "/jobs") renderJobs(app, params);
  else if (path === "/environment") renderEnvironment(app);
  else if (path === "/help/dynamic-shapes") renderHelp(app);
  else renderUpload(app, navigate);
  window.scrollTo(0, 0);
}

function renderHelp(root) {
  fill(root, h("h1", {}, "Dynamic shapes, as JSON"), card("Grammar",
    h("p", {}, "By default every size of the example inputs is fixed. Mark a dimension dynamic by giving it a name, and optionally a range; reuse the name wherever another input must have the same size."),
    h("pre", {}, `dynamic_shapes := "auto" | {arg_name: arg_spec, ...} | [arg_spec, ...]
arg_spec       := null | {dim_index: dim, ...} | [dim | null, ...] | nested list/dict mirroring the argument
dim            := {"name": "batch", "min": 1, "max": 64}   declares a named dimension
                | "batch"                  the same size as a declared one
                | "2*batch" | "batch+1" | "2*batch+1"   derived from a declared one
                | "auto" | "dynamic" | "static"          let torch decide / must be dynamic / fixed
                | 7                        static, must equal the example's size`),
    h("h3", {}, "Examples"),
    h("p", {}, "Two inputs sharing a batch size:"),
    h("pre", {}, '{"x": {"0": {"name": "batch", "min": 1, "max": 1024}}, "y": {"0": "batch"}}'),
    h("p", {}, "One input one longer than the other:"),
    h("pre", {}, '{"x": {"0": {"name": "n", "min": 3, "max": 6}}, "y": {"0": "n+1"}}'),
    h("p", {}, "When torch finds that the code needs something else (a size it forces, a relation between sizes), it suggests fixes; with “auto-fix” on (the default) torchport applies them and shows what changed."),
    h("p", {}, h("a", { href: "#/" }, "Back to the form"))));
}

const keyForm = document.getElementById("api-key-form");
const keyInput = document.getElementById("api-key");
function showKey() {
  keyInput.value = "";
  keyInput.placeholder = apiKey() ? "set for this tab" : "not set";
  keyForm.classList.toggle("has-key", Boolean(apiKey()));
}
keyForm.addEventListener("submit", (event) => {
  event.preventDefault();
  if (!keyInput.value.trim()) return;
  setApiKey(keyInput.value.trim());
  showKey();
  route();
});
document.getElementById("api-key-forget").addEventListener("click", () => {
  setApiKey("");
  showKey();
  route();
});
window.addEventListener("torchport:unauthorized", () => {
  banner.hidden = false;
  banner.dataset.code = "unauthorized";
  fill(banner, apiKey()
    ? "This server did not accept the API key. Enter another one above (it stays in this browser tab only)."
    : "This server needs an API key. Enter it above; it stays in this browser tab only and is sent as Authorization: Bearer.");
  keyInput.focus();
});

window.addEventListener("hashchange", route);
showKey();
route();
