// The public /v1 API, as the browser calls it. Paths are relative, so the pages also work
// behind a reverse proxy that mounts the service under a prefix.

const KEY = "torchport.apiKey";

export function apiKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setApiKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : extra;
}

/** An error body from the API (contract §4), thrown by every call that did not succeed. */
export class ApiError extends Error {
  constructor(status, body) {
    super(body?.message || `HTTP ${status}`);
    this.status = status;
    this.body = body || { code: "internal_error", message: `HTTP ${status}` };
  }
}

async function check(response) {
  if (response.ok) return response;
  let body = null;
  try {
    const data = await response.json();
    body = data.error || data;
  } catch {
    body = { code: response.status === 401 ? "unauthorized" : "internal_error", message: `HTTP ${response.status}` };
  }
  const error = new ApiError(response.status, body);
  if (response.status === 401) window.dispatchEvent(new CustomEvent("torchport:unauthorized", { detail: error }));
  throw error;
}

async function getJson(path) {
  const response = await check(await fetch(path, { headers: headers() }));
  return response.json();
}

export function submitExport({ model, inputs, weights, calibration, options }) {
  const form = new FormData();
  form.append("model", model, model.name);
  if (inputs) form.append("inputs", inputs, inputs.name);
  if (weights) form.append("weights", weights, weights.name);
  if (calibration) form.append("calibration", calibration, calibration.name);
  if (options && Object.keys(options).length) form.append("options", JSON.stringify(options));
  return fetch("v1/exports", { method: "POST", body: form, headers: headers() })
    .then(check)
    .then((r) => r.json());
}

export function getJob(id) {
  return getJson(`v1/exports/${encodeURIComponent(id)}`);
}

export function getEnvironment() {
  return getJson("v1/environment");
}

export function listJobs({ status, cursor, limit = 20 } = {}) {
  const query = new URLSearchParams({ limit: String(limit) });
  if (status) query.set("status", status);
  if (cursor) query.set("cursor", cursor);
  return getJson(`v1/exports?${query}`);
}

export async function cancelJob(id) {
  const response = await check(
    await fetch(`v1/exports/${encodeURIComponent(id)}`, { method: "DELETE", headers: headers() }),
  );
  return response.json();
}

export function artifactUrl(id, name) {
  return `v1/exports/${encodeURIComponent(id)}/artifacts/${encodeURIComponent(name)}`;
}

export function getArtifactJson(id, name) {
  return getJson(artifactUrl(id, name));
}

/** Where the API serves a job's uploaded file (`model`, `inputs`, `weights`, `calibration`) back. */
export function uploadUrl(id, field) {
  return `v1/exports/${encodeURIComponent(id)}/uploads/${encodeURIComponent(field)}`;
}

/** Where the API serves one file of a job's uploaded model zip, by its path in the zip. */
export function uploadMemberUrl(id, path) {
  return `${uploadUrl(id, "model")}/files/${path.split("/").map(encodeURIComponent).join("/")}`;
}

/** The text of a source file the job uploaded: the .py model, or a file in its zip. */
export async function getUploadText(id, path = null) {
  const response = await check(await fetch(path ? uploadMemberUrl(id, path) : uploadUrl(id, "model"), { headers: headers() }));
  return response.text();
}

/** A job's uploaded file as a File named as it was uploaded (to fill the form again). */
export async function getUploadFile(id, field, name) {
  const response = await check(await fetch(uploadUrl(id, field), { headers: headers() }));
  const blob = await response.blob();
  return new File([blob], name, { type: blob.type });
}

/** Where the API serves every artifact of a job as one zip, with a manifest of digests. */
export function archiveUrl(id) {
  return `v1/exports/${encodeURIComponent(id)}/artifacts.zip`;
}

/** Download an artifact: a plain link when no key is needed, else fetched with the key. */
export function downloadArtifact(id, name) {
  return download(artifactUrl(id, name), name);
}

/** Download every artifact of a job as `<id>.zip` (GET …/artifacts.zip), as artifacts are. */
export function downloadArchive(id) {
  return download(archiveUrl(id), `${id}.zip`);
}

async function download(path, name) {
  if (!apiKey()) {
    saveUrl(path, name);
    return;
  }
  // a link cannot send the Authorization header: fetched, then saved from memory
  const response = await check(await fetch(path, { headers: headers() }));
  const url = URL.createObjectURL(await response.blob());
  saveUrl(url, name);
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

export function saveUrl(url, name) {
  const link = document.createElement("a");
  link.href = url;
  link.download = name;
  document.body.append(link);
  link.click();
  link.remove();
}

/** Save a JSON value as a file. */
export function saveJson(value, name) {
  const url = URL.createObjectURL(new Blob([JSON.stringify(value, null, 2)], { type: "application/json" }));
  saveUrl(url, name);
  setTimeout(() => URL.revokeObjectURL(url), 60_000);
}

/**
 * Follow a job's server-sent events. EventSource cannot send an Authorization header, so the
 * stream is read with fetch. Calls onStage(event) per stage event and onJob(job) at the end;
 * resumes from the last id if the connection drops. Returns a function that stops following.
 */
export function followJob(id, { onStage, onJob, onError }) {
  const controller = new AbortController();
  let lastId = null;
  let finished = false;

  async function connect() {
    const extra = lastId === null ? {} : { "Last-Event-ID": lastId };
    const response = await check(
      await fetch(`v1/exports/${encodeURIComponent(id)}/events`, {
        headers: headers({ Accept: "text/event-stream", ...extra }),
        signal: controller.signal,
      }),
    );
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value.replace(/\r\n/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        dispatch(buffer.slice(0, end));
        buffer = buffer.slice(end + 2);
      }
    }
  }

  function dispatch(block) {
    let event = "message";
    const data = [];
    let eventId = null;
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      const value = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
      if (field === "event") event = value;
      else if (field === "data") data.push(value);
      else if (field === "id") eventId = value;
    }
    if (!data.length) return;
    if (eventId !== null) lastId = eventId;
    const payload = JSON.parse(data.join("\n"));
    if (event === "stage") onStage(payload);
    else if (event === "job") {
      finished = true;
      onJob(payload);
    }
  }

  (async () => {
    let failures = 0;
    while (!finished && !controller.signal.aborted) {
      try {
        await connect();
        failures = 0;
      } catch (error) {
        if (controller.signal.aborted) return;
        if (error instanceof ApiError && error.status < 500) {
          onError(error);
          return;
        }
        failures += 1;
        if (failures > 5) {
          onError(error);
          return;
        }
      }
      if (!finished) await new Promise((r) => setTimeout(r, 500 * failures + 200));
    }
  })();
  return () => controller.abort();
}
