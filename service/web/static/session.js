// What the browser keeps about its own uploads for this tab: the files (in memory, for
// "export again"), and the model's source text (sessionStorage, for the failure view).

const SOURCE = "torchport.source.";
const MAX_SOURCE_CHARS = 1_000_000;

export const uploads = {
  /** Job id → the files this tab uploaded for it: {model, inputs, weights, calibration}. */
  files: new Map(),
  /** A draft the upload form starts from (set by "export again" buttons). */
  draft: null,
};

/** Remember the uploaded model's text for job `id` (only .py files; zips are skipped). */
export async function rememberSource(id, file) {
  if (!file || !file.name.endsWith(".py") || file.size > MAX_SOURCE_CHARS) return;
  try {
    sessionStorage.setItem(SOURCE + id, JSON.stringify({ name: file.name, text: await file.text() }));
  } catch {
    // Storage full or disabled: the failure view falls back to the error's code line.
  }
}

/** {name, text} of the model uploaded for job `id` from this tab, or null. */
export function sourceOf(id) {
  try {
    return JSON.parse(sessionStorage.getItem(SOURCE + id) || "null");
  } catch {
    return null;
  }
}
