// "Export again": the upload form opened with a job's options and files, with changes.

import { h } from "./dom.js";
import { getUploadFile } from "./api.js";
import { uploads } from "./session.js";

/**
 * Open the upload form with this job's options and its files: the ones this tab uploaded, or
 * else the job's uploads fetched back from the API (the form opens without files if that fails).
 */
export async function startAgain(job, navigate, changes = {}) {
  let same = uploads.files.get(job.id);
  if (!same && job.model_name) {
    try {
      const fetchFile = (field) => (job[`${field}_name`] ? getUploadFile(job.id, field, job[`${field}_name`]) : null);
      const [model, inputs, weights, calibration] = await Promise.all(["model", "inputs", "weights", "calibration"].map(fetchFile));
      same = { model, inputs, weights, calibration };
    } catch {
      same = null;
    }
  }
  uploads.draft = {
    ...(same || {}),
    options: { ...job.options, ...changes.options },
    inputs_meta: changes.inputs_meta,
  };
  navigate("#/");
}

export function againButton(job, navigate, changes = {}, label = "Change options and export again") {
  const button = h("button", { type: "button", class: "secondary" }, label);
  button.addEventListener("click", () => {
    button.disabled = true;
    startAgain(job, navigate, changes);
  });
  return button;
}
