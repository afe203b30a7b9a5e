// The upload form: model, optional inputs, weights and int8 calibration inputs, the common
// options, dynamic shapes.
import { h, fill, card, formatBytes } from "./dom.js";
import { submitExport, ApiError } from "./api.js";
import { checkDynamicShapes, dimensionEditor } from "./dynamic_shapes.js";
import { uploads, rememberSource } from "./session.js";
import { checkpointFiles, isCheckpoint, storedZip, zipNames } from "./checkpoint_zip.js";
import { dropContents } from "./folder_drop.js";
import { GENERATION_TASKS, generationFields } from "./generation_fields.js";

/** The dynamic-shapes placeholder: a module's arguments, or a checkpoint task's inputs and dim names. */
const CODE_SHAPES = '{"x": {"0": {"name": "batch", "min": 1, "max": 64}}, "y": {"0": "batch"}}';
const CHECKPOINT_SHAPES = '{"input_ids": {"0": {"name": "batch_size", "min": 1, "max": 8}, "1": {"name": "sequence_length", "min": 1, "max": 128}}}';

/** The deployment targets the form offers, in the order the engine converts them. */
export const TARGETS = [
  ["onnx", "ONNX (model.onnx, ONNX Runtime)"],
  ["aoti", "AOTInductor (model.aoti.pt2)"],
  ["executorch", "ExecuTorch (model.pte, XNNPACK)"],
];
const AOTI_ISAS = [
  ["portable", "portable (default): x86-64-v3, AVX2 kernels"],
  ["native", "native: the worker's own CPU (widest vector ISA)"],
  ["x86-64", "x86-64: scalar kernels, any x86-64 CPU"],
  ["x86-64-v2", "x86-64-v2: scalar kernels, SSE4.2 CPUs"],
  ["x86-64-v3", "x86-64-v3: AVX2 kernels"],
  ["x86-64-v4", "x86-64-v4: AVX-512 kernels"],
];

/** Option `quantize.scheme`: which targets take each is in docs/targets.md. */
const QUANTIZE_SCHEMES = [
  ["none", "none (default): float artifacts"],
  ["int8", "int8: static int8, calibrated on the samples or your file (executorch, onnx)"],
  ["int8_dynamic", "int8_dynamic: int8 weights, activations at run time (executorch, onnx, aoti)"],
  ["int8_weight_only", "int8_weight_only: torchao, linears (executorch, aoti)"],
  ["int4_weight_only", "int4_weight_only: 4-bit weights, linears (executorch, aoti, onnx)"],
  ["8da4w", "8da4w: 8-bit activations, 4-bit weights, LLM linears (executorch, aoti, onnx)"],
];

const KINDS = {
  model: { label: "Model", accept: [".py", ".zip"], required: true, help: "A .py file defining `model` and `example_args`, a .zip of a package, or a Hugging Face checkpoint: its save_pretrained folder (choose it below) or a .zip of it." },
  inputs: { label: "Example inputs", accept: [".safetensors", ".pt", ".json"], help: "Optional; replaces `example_args`. .safetensors (args.0, kwargs.mask…), .pt or a .json spec." },
  weights: { label: "Weights", accept: [".safetensors", ".pt", ".pth"], help: "Optional state dict (or a training checkpoint holding one under model_state, state_dict, model…), loaded before export; names must match unless options weights.strict is false." },
  calibration: { label: "Calibration inputs", accept: [".safetensors", ".pt", ".json"], help: "Optional, int8 only: a list of example inputs int8 calibrates its activation ranges on (.safetensors <n>.args.<i>, a .pt list or a .json list of specs). Default: the example and the verification samples." },
};

function meta(name) {
  const element = document.querySelector(`meta[name="${name}"]`);
  try {
    return JSON.parse(element?.content || "null");
  } catch {
    return null;
  }
}

function limits() {
  return meta("torchport-limits") || {};
}

/** A file's limit: a checkpoint zip has its own (weights inside), as the server applies it. */
function limitOf(kind, zone) {
  const max = limits();
  return kind === "model" && zone.checkpoint && max.checkpoint ? max.checkpoint : max[kind];
}

function extensionOf(name) {
  const match = /\.[^.]+$/.exec(name.toLowerCase());
  return match ? match[0] : "";
}

/** Which field a dropped file belongs to, by its extension (ambiguous .pt goes to weights if inputs is taken; .pth is weights). */
function fieldFor(file, files) {
  const ext = extensionOf(file.name);
  if (ext === ".py" || ext === ".zip") return "model";
  if (ext === ".json") return "inputs";
  if (ext === ".pth") return "weights";
  if (ext === ".safetensors" || ext === ".pt") return files.inputs || /weight|state|ckpt|checkpoint/i.test(file.name) ? "weights" : "inputs";
  return null;
}

export function renderUpload(root, navigate) {
  const draft = uploads.draft || {};
  uploads.draft = null;
  const options = draft.options || {};
  const files = { model: draft.model || null, inputs: draft.inputs || null, weights: draft.weights || null, calibration: draft.calibration || null };
  const zones = {};
  const errors = h("ul", { class: "form-errors", id: "form-errors", hidden: true });

  for (const kind of Object.keys(KINDS)) zones[kind] = dropZone(kind, files, () => refresh(), kind === "model" ? dropped : null);

  const entry = h("input", { type: "text", name: "entry", placeholder: "pkg/net.py", value: options.entry || "" });
  const entryRow = h("label", { class: "field", hidden: true }, "Entry file inside the zip", entry);
  const tasks = meta("torchport-tasks") || [];
  const task = select("task", [["", "infer from the checkpoint"], ...tasks.map((t) => [t, t])], options.task || "");
  task.id = "task";
  const taskRow = h("label", { class: "field", id: "task-row", hidden: true }, "Task (what the checkpoint is exported for)", task);
  const generation = generationFields(options.generation);
  generation.element.hidden = true;
  task.addEventListener("change", () => refresh());
  const folder = h("input", { type: "file", webkitdirectory: true, hidden: true, "data-testid": "folder-model" });
  const folderStatus = h("span", { class: "muted small", id: "folder-status" });
  const folderButton = h("button", { type: "button", class: "small", id: "choose-folder" }, "Choose a checkpoint folder…");
  folderButton.addEventListener("click", () => folder.click());
  folder.addEventListener("change", async () => {
    const chosen = [...folder.files];
    if (!chosen.length) return;
    await useFolder((chosen[0].webkitRelativePath || "checkpoint").split("/", 1)[0], chosen);
  });
  /** A checkpoint folder, chosen or dropped (its Files, or a promise of its {file, path}), zipped as the model. */
  async function useFolder(name, items) {
    fill(folderStatus, `zipping ${name}…`);
    try {
      const picked = await checkpointFiles(await items);
      zones.model.setFile(await storedZip(`${name}.zip`, name, picked));
      fill(folderStatus, `${name}: ${picked.map((e) => e.path).join(", ")}`);
    } catch (error) {
      fill(folderStatus, h("span", { class: "error-line", "data-code": "upload_too_large" }, `${name}: ${error.message}`));
    }
  }
  /** A drop on the model field or the form: a folder is zipped as a chosen one; several files with a config.json are a checkpoint's, zipped together; other files go to the field their extension says. */
  function dropped(dataTransfer) {
    const contents = dropContents(dataTransfer);
    if (contents.folder) return useFolder(contents.folder, contents.items);
    if (contents.files.length > 1 && contents.files.some((file) => file.name === "config.json")) {
      return useFolder("checkpoint", contents.files.map((file) => ({ file, path: file.name })));
    }
    for (const file of contents.files) {
      const kind = fieldFor(file, files);
      if (kind) zones[kind].setFile(file);
    }
    return null;
  }
  const folderRow = h("div", { class: "field" }, folderButton, folder, folderStatus);
  const symbol = h("input", { type: "text", name: "symbol", value: options.symbol || "model" });
  const symbolRow = h("details", { id: "symbol-row" }, h("summary", {}, "Module attribute"), h("label", { class: "field" }, "Name of the model in the file", symbol));
  const requires = h("textarea", { name: "requires", rows: 2, spellcheck: "false", placeholder: "transformers>=4.40" });
  requires.value = (options.requires || []).join("\n");

  // Short choices that fit the field; what each does is said under it.
  const strict = select("strict", [["false", "non-strict (default)"], ["true", "strict (TorchDynamo)"], ["auto", "auto: strict, then non-strict"]], String(options.strict ?? "false"));
  const strictHelp = h("span", { class: "help", id: "strict-help" }, STRICT_HELP[strict.value]);
  strict.addEventListener("change", () => { strictHelp.textContent = STRICT_HELP[strict.value]; });
  const mode = select("decomposition", [["core_aten", "core ATen (default)"], ["none", "none: keep the ops as traced"], ["custom", "custom: decompose only the listed ops"]], options.decomposition?.mode || "core_aten");
  const preserve = h("textarea", { name: "preserve", rows: 2, placeholder: "aten.conv2d.default\naten.layer_norm.default", spellcheck: "false" }, (options.decomposition?.preserve || []).join("\n"));
  const decompose = h("textarea", { name: "decompose", rows: 2, placeholder: "aten.linear.default", spellcheck: "false" }, (options.decomposition?.decompose || []).join("\n"));
  const preserveRow = h("label", { class: "field", id: "preserve-row" }, "Keep these ops (one per line)", preserve);
  const decomposeRow = h("label", { class: "field", hidden: true }, "Decompose only these ops (one per line)", decompose);
  const device = select("device", [["cpu", "cpu"], ["cuda", "cuda (GPU workers)"]], options.device || "cpu");
  const verify = h("input", { type: "checkbox", name: "verify", checked: options.verify?.enabled !== false });
  const atol = h("input", { type: "number", name: "atol", class: "tolerance", step: "any", min: 0, placeholder: "by dtype (float32: 1e-5)", value: options.verify?.atol ?? "" });
  const rtol = h("input", { type: "number", name: "rtol", class: "tolerance", step: "any", min: 0, placeholder: "by dtype (float32: 1.3e-6)", value: options.verify?.rtol ?? "" });
  const samples = h("input", { type: "number", name: "samples", min: 0, max: 64, step: 1, value: options.verify?.samples ?? 3 });
  const roundtrip = h("input", { type: "checkbox", name: "roundtrip", checked: options.verify?.roundtrip !== false });
  const verifyFields = h("div", { class: "row" },
    h("label", { class: "field" }, "atol", atol), h("label", { class: "field" }, "rtol", rtol),
    h("label", { class: "field" }, "extra samples in the dynamic ranges", samples),
    h("label", { class: "check" }, roundtrip, " save → load round trip"));

  const chosenTargets = new Set(options.targets || []);
  const targetBoxes = TARGETS.map(([name, label]) => [name, label,
    h("input", { type: "checkbox", name: "target", value: name, "data-target": name, checked: chosenTargets.has(name) })]);
  const targetsRequired = h("input", { type: "checkbox", name: "targets_required", id: "targets-required", checked: options.targets_required === true });
  const requiredRow = h("label", { class: "check" }, targetsRequired, " fail the job if a target fails (by default the job succeeds, the target is marked failed and a warning says why)");
  const isa = select("aoti_isa", AOTI_ISAS, options.aoti?.isa || "portable");
  isa.id = "aoti-isa";
  const isaRow = h("label", { class: "field", id: "aoti-isa-row" }, "AOTInductor instruction set", isa,
    h("span", { class: "muted small" }, "Which x86-64 CPUs the compiled package runs on: portable suits any AVX2 + FMA CPU (Intel Haswell, AMD Zen and later); native may crash (SIGILL) on an older CPU than the worker's. The worker runs the package to verify it, so it must support the level."));
  const quantize = select("quantize", QUANTIZE_SCHEMES, options.quantize?.scheme || "none");
  quantize.id = "quantize";
  const quantizeRow = h("label", { class: "field", id: "quantize-row" }, "Quantize the targets", quantize,
    h("span", { class: "muted small" }, "Each quantized artifact is compared with your float model (cosine, max abs error, top-1, greedy tokens) and must stay within the budget, cosine ≥ 0.99 by default; program.pt2 stays float."));
  // Only int8 reads a calibration file (the API refuses one with another scheme): hidden, it is not sent.
  const calibrationRow = h("div", { class: "field", id: "calibration-row", hidden: true }, zones.calibration);
  const targetsFields = h("fieldset", { class: "targets", id: "targets" },
    h("legend", {}, "Deployment targets (besides program.pt2; each is run in its own runtime and verified against eager PyTorch)"),
    h("div", { class: "target-boxes" }, targetBoxes.map(([name, label, box]) => h("label", { class: "check" }, box, ` ${label}`))),
    isaRow, quantizeRow, calibrationRow, requiredRow);

  const shapesText = h("textarea", { name: "dynamic_shapes", id: "dynamic-shapes", rows: 5, spellcheck: "false", placeholder: CODE_SHAPES },
    options.dynamic_shapes ? JSON.stringify(options.dynamic_shapes, null, 1) : "");
  const autoFix = h("input", { type: "checkbox", name: "auto_fix", id: "auto-fix", checked: options.auto_fix_dynamic_shapes !== false });
  const shapesStatus = h("div", { class: "inline-status", id: "dynamic-shapes-status" });
  const editorHost = h("div", { class: "editor-host" });
  if (draft.inputs_meta?.length) {
    editorHost.append(
      h("p", { class: "muted" }, "The example inputs of the earlier job; tick the dimensions that may change:"),
      dimensionEditor(draft.inputs_meta, (spec) => {
        shapesText.value = spec ? JSON.stringify(spec, null, 1) : "";
        checkShapes();
      }, options.dynamic_shapes),
    );
  }

  function checkShapes() {
    const { errors: problems } = checkDynamicShapes(shapesText.value);
    shapesText.classList.toggle("invalid", problems.length > 0);
    if (!shapesText.value.trim()) {
      fill(shapesStatus, h("span", { class: "muted" }, "Empty: all sizes static, or the module's own `dynamic_shapes`."));
    } else if (problems.length) {
      fill(shapesStatus, ...problems.map((p) => h("div", { class: "error-line", "data-code": "invalid_request" }, p.path ? `${p.path}: ${p.message}` : p.message)));
    } else {
      fill(shapesStatus, h("span", { class: "ok-line", "data-valid": "true" }, "✓ valid dynamic-shapes JSON"));
    }
    return problems;
  }
  shapesText.addEventListener("input", checkShapes);
  checkShapes();

  function refresh() {
    const isZip = files.model && extensionOf(files.model.name) === ".zip";
    // A checkpoint has no module attribute and no code of its own: its fields are the task's.
    const checkpoint = Boolean(isZip && zones.model.checkpoint);
    entryRow.hidden = !isZip || checkpoint;
    taskRow.hidden = !checkpoint;
    symbolRow.hidden = checkpoint;
    generation.element.hidden = !checkpoint || !GENERATION_TASKS.has(task.value);
    shapesText.placeholder = checkpoint ? CHECKPOINT_SHAPES : CODE_SHAPES;
    decomposeRow.hidden = mode.value !== "custom";
    preserveRow.hidden = mode.value === "none" || checkpoint;
    verifyFields.hidden = !verify.checked;
    const wanted = checkedTargets();
    isaRow.hidden = !wanted.includes("aoti");
    requiredRow.hidden = wanted.length === 0;
    quantizeRow.hidden = wanted.length === 0;
    calibrationRow.hidden = quantizeRow.hidden || quantize.value !== "int8";
  }
  /** The files to send: the calibration one only while its row shows (scheme int8). */
  function sentFiles() {
    return { ...files, calibration: calibrationRow.hidden ? null : files.calibration };
  }
  function checkedTargets() {
    return targetBoxes.filter(([, , box]) => box.checked).map(([name]) => name);
  }
  mode.addEventListener("change", refresh);
  verify.addEventListener("change", refresh);
  quantize.addEventListener("change", refresh);
  for (const [, , box] of targetBoxes) box.addEventListener("change", refresh);
  refresh();
  // A model brought back by "Export again" is looked into as a chosen one is.
  if (files.model) zones.model.setFile(files.model);

  const submit = h("button", { type: "submit", class: "primary", id: "submit" }, "Export");
  const form = h("form", { id: "upload-form", novalidate: true },
    h("div", { class: "intro" },
      h("h1", {}, "Export a PyTorch model"),
      h("p", {}, "Drop your model file; torchport runs ", h("code", {}, "torch.export"), " on it in a sandbox, checks the result against eager PyTorch and gives you the ",
        h("code", {}, ".pt2"), " program with its graph. Nothing here is sent anywhere but this server.")),
    card("Files", h("div", { class: "zones" }, zones.model, zones.inputs, zones.weights), folderRow, entryRow, taskRow, generation.element, symbolRow),
    card("Options",
      h("div", { class: "grid" },
        h("label", { class: "field" }, "Tracing", strict, strictHelp),
        h("label", { class: "field" }, "Device", device),
        h("label", { class: "field" }, "Decomposition", mode)),
      preserveRow, decomposeRow,
      h("label", { class: "check" }, verify, " verify the exported program against eager PyTorch"),
      verifyFields,
      targetsFields,
      h("label", { class: "field" }, h("span", {}, "Libraries the model needs, one pip specifier a line (optional; ",
        h("a", { href: "#/environment", id: "environment-link" }, "what the workers have"), ")"), requires)),
    card("Dynamic shapes",
      h("p", { class: "muted" }, "Which input sizes may change at run time. Give a dimension a name with a range where it is declared, and use the same name where another input has the same size. ",
        h("a", { href: "#/help/dynamic-shapes" }, "Grammar")),
      editorHost, shapesText, shapesStatus,
      h("label", { class: "check" }, autoFix, " when the code needs different shapes, apply torch's suggested fixes and retry (the report lists them)")),
    errors,
    h("div", { class: "actions" }, submit));

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const problems = validate();
    fillErrors(errors, problems);
    if (problems.length) return;
    submit.disabled = true;
    submit.textContent = "Uploading…";
    try {
      const body = buildOptions();
      const { model, inputs, weights, calibration } = sentFiles();
      const job = await submitExport({ model, inputs, weights, calibration, options: body });
      uploads.files.set(job.id, { model, inputs, weights, calibration });
      await rememberSource(job.id, files.model);
      navigate(`#/jobs/${job.id}`);
    } catch (error) {
      const body = error instanceof ApiError ? error.body : { code: "internal_error", message: String(error) };
      fillErrors(errors, [{ code: body.code, message: body.message, hint: body.hint }]);
    } finally {
      submit.disabled = false;
      submit.textContent = "Export";
    }
  });

  // Files dropped anywhere on the page go to the field their extension says.
  form.addEventListener("dragover", (event) => event.preventDefault());
  form.addEventListener("drop", (event) => {
    if (event.defaultPrevented) return;
    event.preventDefault();
    dropped(event.dataTransfer);
  });

  function buildOptions() {
    const body = {};
    if (!symbolRow.hidden && symbol.value.trim() && symbol.value.trim() !== "model") body.symbol = symbol.value.trim();
    if (!entryRow.hidden && entry.value.trim()) body.entry = entry.value.trim();
    if (!taskRow.hidden && task.value) body.task = task.value;
    if (!generation.element.hidden && generation.value()) body.generation = generation.value();
    if (strict.value !== "false") body.strict = strict.value === "auto" ? "auto" : true;
    const lines = (area) => area.value.split(/[\n,]/).map((s) => s.trim()).filter(Boolean);
    const decomposition = { mode: mode.value };
    if (!preserveRow.hidden && lines(preserve).length) decomposition.preserve = lines(preserve);
    if (mode.value === "custom") decomposition.decompose = lines(decompose);
    if (mode.value !== "core_aten" || decomposition.preserve) body.decomposition = decomposition;
    if (device.value !== "cpu") body.device = device.value;
    const v = { enabled: verify.checked };
    if (verify.checked) {
      if (atol.value !== "") v.atol = Number(atol.value);
      if (rtol.value !== "") v.rtol = Number(rtol.value);
      v.samples = Number(samples.value || 0);
      v.roundtrip = roundtrip.checked;
    }
    body.verify = v;
    const wanted = checkedTargets();
    if (wanted.length) {
      body.targets = wanted;
      if (targetsRequired.checked) body.targets_required = true;
      if (wanted.includes("aoti") && isa.value !== "portable") body.aoti = { isa: isa.value };
      if (quantize.value !== "none") body.quantize = { ...(options.quantize || {}), scheme: quantize.value };
    }
    const shapes = checkDynamicShapes(shapesText.value).value;
    if (shapes !== null) body.dynamic_shapes = shapes;
    if (!autoFix.checked) body.auto_fix_dynamic_shapes = false;
    // One per line: a specifier may hold commas (numpy>=1.26,<3).
    const required = requires.value.split("\n").map((s) => s.trim()).filter(Boolean);
    if (required.length) body.requires = required;
    return body;
  }

  function validate() {
    const problems = [];
    const sent = sentFiles();
    if (!files.model) problems.push({ field: "model", code: "invalid_request", message: "Choose a model file (.py or .zip)." });
    for (const [kind, spec] of Object.entries(KINDS)) {
      const file = sent[kind];
      if (!file) continue;
      if (!spec.accept.includes(extensionOf(file.name))) {
        problems.push({ field: kind, code: "invalid_request", message: `${spec.label}: ${file.name} is not ${spec.accept.join(", ")}.` });
      }
      const max = limitOf(kind, zones[kind]);
      if (max && file.size > max) {
        problems.push({ field: kind, code: "upload_too_large", message: `${spec.label}: ${file.name} is ${formatBytes(file.size)}, over this server's limit of ${formatBytes(max)}.` });
      }
      if (file.size === 0) problems.push({ field: kind, code: "invalid_request", message: `${spec.label}: ${file.name} is empty.` });
    }
    for (const kind of ["inputs", "calibration"]) {
      const file = sent[kind];
      if (file && extensionOf(file.name) === ".json" && zones[kind].jsonError) {
        problems.push({ field: kind, code: "invalid_request", message: `${KINDS[kind].label}: ${file.name} is not valid JSON (${zones[kind].jsonError}).` });
      }
    }
    if (!entryRow.hidden && !entry.value.trim()) {
      problems.push({ field: "entry", code: "invalid_request", message: "A zip needs the entry file inside it, e.g. pkg/net.py." });
    }
    for (const p of checkDynamicShapes(shapesText.value).errors) {
      problems.push({ field: "dynamic_shapes", code: "invalid_request", message: `Dynamic shapes${p.path ? ` at ${p.path}` : ""}: ${p.message}` });
    }
    if (verify.checked) {
      const n = Number(samples.value || 0);
      if (!Number.isInteger(n) || n < 0 || n > 64) problems.push({ field: "samples", code: "invalid_request", message: "Samples must be a whole number from 0 to 64." });
      for (const [name, el] of [["atol", atol], ["rtol", rtol]]) {
        if (el.value !== "" && !(Number(el.value) >= 0)) problems.push({ field: name, code: "invalid_request", message: `${name} must be a number ≥ 0.` });
      }
    }
    if (!generation.element.hidden) problems.push(...generation.problems());
    if (mode.value === "custom" && !decompose.value.trim()) {
      problems.push({ field: "decompose", code: "invalid_request", message: "Custom decomposition needs at least one op to decompose." });
    }
    return problems;
  }

  fill(root, form);
}

function fillErrors(list, problems) {
  list.hidden = problems.length === 0;
  fill(list, ...problems.map((p) => h("li", { "data-code": p.code, "data-field": p.field || "" },
    h("code", {}, p.code), " ", p.message, p.hint ? h("div", { class: "hint" }, p.hint) : null)));
  if (problems.length) list.scrollIntoView({ block: "nearest" });
}

const STRICT_HELP = {
  false: "runs your Python as Python and traces the tensor operations",
  true: "TorchDynamo reads your Python: stricter about Python features",
  auto: "strict first, non-strict when strict fails",
};

function select(name, choices, value) {
  return h("select", { name }, choices.map(([v, label]) => h("option", { value: v, selected: v === value }, label)));
}

/** A file field one drops a file on or clicks; `onDrop(dataTransfer)`, when given, takes a drop whole (the model's: a folder, several files). */
function dropZone(kind, files, onChange, onDrop = null) {
  const spec = KINDS[kind];
  const input = h("input", { type: "file", name: kind, accept: spec.accept.join(","), hidden: true, "data-testid": `file-${kind}` });
  const chosen = h("div", { class: "chosen" });
  const zone = h("div", { class: `dropzone${spec.required ? " required" : ""}`, "data-zone": kind, tabindex: 0, role: "button" },
    h("strong", {}, spec.label, spec.required ? "" : " (optional)"),
    h("span", { class: "muted" }, `Drop ${spec.accept.join(" / ")} here or click to choose`),
    h("span", { class: "help" }, spec.help), chosen, input);
  zone.jsonError = null;
  zone.checkpoint = false;

  zone.setFile = async (file) => {
    files[kind] = file;
    zone.jsonError = null;
    zone.checkpoint = false;
    if (file && kind === "model" && extensionOf(file.name) === ".zip") {
      const names = await zipNames(file).catch(() => null);
      zone.checkpoint = names !== null && isCheckpoint(names);
    }
    if (file && extensionOf(file.name) === ".json" && file.size < 5 * 2 ** 20) {
      try {
        JSON.parse(await file.text());
      } catch (error) {
        zone.jsonError = error.message;
      }
    }
    render();
    onChange();
  };
  function render() {
    const file = files[kind];
    zone.classList.toggle("has-file", Boolean(file));
    if (!file) {
      fill(chosen);
      return;
    }
    const wrongType = !spec.accept.includes(extensionOf(file.name));
    const max = limitOf(kind, zone);
    const problem = wrongType ? `not ${spec.accept.join(", ")}` : max && file.size > max ? `over the ${formatBytes(max)} limit` : zone.jsonError ? `invalid JSON: ${zone.jsonError}` : null;
    const remove = h("button", { type: "button", class: "small", "aria-label": `remove ${kind}` }, "✕");
    remove.addEventListener("click", (event) => {
      event.stopPropagation();
      input.value = "";
      zone.setFile(null);
    });
    fill(chosen, h("span", { class: "file-name" }, file.name), h("span", { class: "muted" }, ` ${formatBytes(file.size)} `),
      problem ? h("span", { class: "error-line", "data-code": wrongType || zone.jsonError ? "invalid_request" : "upload_too_large" }, problem) : null, remove);
  }
  zone.addEventListener("click", (event) => {
    if (event.target !== input && event.target.tagName !== "BUTTON") input.click();
  });
  zone.addEventListener("keydown", (event) => {
    if (event.key === "Enter" || event.key === " ") {
      event.preventDefault();
      input.click();
    }
  });
  input.addEventListener("change", () => zone.setFile(input.files[0] || null));
  zone.addEventListener("dragover", (event) => {
    event.preventDefault();
    zone.classList.add("over");
  });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (event) => {
    event.preventDefault();
    zone.classList.remove("over");
    if (onDrop) {
      onDrop(event.dataTransfer);
      return;
    }
    const file = event.dataTransfer.files[0];
    if (file) zone.setFile(file);
  });
  render();
  return zone;
}
