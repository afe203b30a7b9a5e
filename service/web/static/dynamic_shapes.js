// The dynamic-shapes JSON grammar (docs/contract.md §3) checked in the browser, and an editor
// that builds a spec from the example inputs' names and shapes.
import { h, formatShape } from "./dom.js";

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;
const EXPRESSION = /^\s*(?:(\d+)\s*\*\s*)?([A-Za-z_][A-Za-z0-9_]*)(?:\s*([+-])\s*(\d+))?\s*$/;
const KEYWORDS = new Set(["auto", "dynamic", "static"]);
const DECLARATION_KEYS = new Set(["name", "min", "max", "expr"]);

/**
 * Check a dynamic-shapes text. Returns {value, errors}: value is the parsed spec (null for an
 * empty text), errors a list of {path, message}; the server checks the same grammar again.
 */
export function checkDynamicShapes(text) {
  if (!text.trim()) return { value: null, errors: [] };
  let value;
  try {
    value = JSON.parse(text);
  } catch (error) {
    return { value: null, errors: [{ path: "", message: `not JSON: ${error.message}` }] };
  }
  const errors = [];
  const declared = new Map();
  const references = [];
  if (value === "auto") return { value, errors };
  if (typeof value !== "object" || value === null) {
    errors.push({ path: "", message: 'must be "auto", an object keyed by argument name, or a list' });
    return { value, errors };
  }
  walk(value, "", { errors, declared, references, top: true });
  for (const { name, path } of references) {
    if (!declared.has(name)) {
      errors.push({ path, message: `"${name}" is used but never declared as {"name": "${name}", "min": …, "max": …}` });
    }
  }
  return { value, errors };
}

function walk(spec, path, state) {
  const { errors } = state;
  if (spec === null) return;
  if (typeof spec === "number") {
    if (!Number.isInteger(spec) || spec < 0) errors.push({ path, message: "a static size must be a whole number ≥ 0" });
    return;
  }
  if (typeof spec === "boolean") {
    errors.push({ path, message: "true/false is not a dimension" });
    return;
  }
  if (typeof spec === "string") {
    checkExpression(spec, path, state);
    return;
  }
  if (Array.isArray(spec)) {
    spec.forEach((item, i) => walk(item, `${path}[${i}]`, state));
    return;
  }
  if (!state.top && "name" in spec && typeof spec.name === "string") {
    checkDeclaration(spec, path, state);
    return;
  }
  for (const [key, item] of Object.entries(spec)) {
    walk(item, path ? `${path}.${key}` : key, { ...state, top: false });
  }
}

function checkExpression(text, path, state) {
  if (KEYWORDS.has(text.trim())) return;
  const match = EXPRESSION.exec(text);
  if (!match) {
    state.errors.push({ path, message: `"${text}" is not a dimension: use a name, "2*name", "name+1", "auto", "dynamic", "static" or a number` });
    return;
  }
  state.references.push({ name: match[2], path });
}

function checkDeclaration(spec, path, state) {
  const { errors, declared } = state;
  for (const key of Object.keys(spec)) {
    if (!DECLARATION_KEYS.has(key)) errors.push({ path, message: `unknown key "${key}" in a dimension (name, min, max, expr)` });
  }
  if (!NAME.test(spec.name)) errors.push({ path, message: `"${spec.name}" is not a valid dimension name` });
  for (const bound of ["min", "max"]) {
    const v = spec[bound];
    if (v !== undefined && v !== null && (!Number.isInteger(v) || v < 0)) {
      errors.push({ path, message: `${bound} must be a whole number ≥ 0` });
    }
  }
  if (Number.isInteger(spec.min) && Number.isInteger(spec.max) && spec.min > spec.max) {
    errors.push({ path, message: `min (${spec.min}) is larger than max (${spec.max})` });
  }
  if (spec.expr !== undefined && spec.expr !== null) checkExpression(String(spec.expr), path, state);
  const earlier = declared.get(spec.name);
  if (earlier !== undefined && earlier !== path) {
    errors.push({ path, message: `"${spec.name}" is declared twice (also at ${earlier}); refer to it by name instead` });
  }
  declared.set(spec.name, path);
}

/**
 * An editor for inputs of known shape: each dimension is static, or a named dynamic
 * dimension (inputs sharing a name share the symbol). `inputs` is [{name, shape, dtype}];
 * `onChange(spec)` gets the JSON spec whenever a control changes.
 */
export function dimensionEditor(inputs, onChange, initial = null) {
  const rows = [];
  const controls = [];
  for (const input of inputs) {
    (input.shape || []).forEach((size, index) => {
      const preset = initialDim(initial, input.name, index);
      const dynamic = h("input", { type: "checkbox", "data-dim": `${input.name}.${index}`, checked: preset !== null });
      const named = preset?.name || (index === 0 ? "batch" : `${input.name}_${index}`);
      // as wide as its name (`sequence_length`, `encoder_sequence_length`), never cut
      const name = h("input", { type: "text", class: "dim-name", value: named, size: Math.max(10, named.length + 1), "aria-label": `name of ${input.name} dim ${index}` });
      name.addEventListener("input", () => { name.size = Math.max(10, name.value.length + 1); });
      const min = h("input", { type: "number", min: 0, class: "dim-min", value: preset?.min ?? "", placeholder: "min", "aria-label": "min" });
      const max = h("input", { type: "number", min: 0, class: "dim-max", value: preset?.max ?? "", placeholder: "max", "aria-label": "max" });
      const control = { input: input.name, index, size, dynamic, name, min, max };
      controls.push(control);
      const sync = () => {
        for (const el of [name, min, max]) el.disabled = !dynamic.checked;
        onChange(buildSpec(controls));
      };
      for (const el of [dynamic, name, min, max]) el.addEventListener("input", sync);
      for (const el of [name, min, max]) el.disabled = !dynamic.checked;
      rows.push(
        h("tr", {},
          h("td", {}, index === 0 ? h("code", {}, input.name) : ""),
          h("td", {}, index === 0 ? formatShape(input.shape) : ""),
          h("td", {}, `dim ${index}`),
          h("td", {}, String(size)),
          h("td", {}, h("label", {}, dynamic, " dynamic")),
          h("td", {}, name), h("td", {}, min), h("td", {}, max)),
      );
    });
  }
  return h("table", { class: "dim-editor" },
    h("thead", {}, h("tr", {}, ["input", "example shape", "dim", "size", "", "name (same name = same size)", "min", "max"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows));
}

function initialDim(spec, input, index) {
  const arg = spec && typeof spec === "object" ? spec[input] : null;
  if (!arg || typeof arg !== "object") return null;
  const dim = Array.isArray(arg) ? arg[index] : arg[String(index)];
  if (dim && typeof dim === "object" && dim.name) return dim;
  if (typeof dim === "string" && !KEYWORDS.has(dim)) return { name: dim };
  return null;
}

/** The JSON spec of the editor's controls; the first use of a name declares it. */
export function buildSpec(controls) {
  const spec = {};
  const declared = new Set();
  for (const c of controls) {
    if (!c.dynamic.checked) continue;
    const name = c.name.value.trim();
    const dims = (spec[c.input] ||= {});
    if (declared.has(name)) {
      dims[String(c.index)] = name;
      continue;
    }
    declared.add(name);
    const dim = { name };
    if (c.min.value !== "") dim.min = Number(c.min.value);
    if (c.max.value !== "") dim.max = Number(c.max.value);
    dims[String(c.index)] = dim;
  }
  return Object.keys(spec).length ? spec : null;
}

const FIX_DIM = /^(\w+)\s*=\s*Dim\(\s*['"](\w+)['"]\s*(?:,\s*min\s*=\s*(\d+))?\s*(?:,\s*max\s*=\s*(\d+))?\s*\)$/;
const FIX_STATIC = /^(\w+)\s*=\s*(\d+)$/;
const FIX_EXPR = /^(\w+)\s*=\s*(.+)$/;

/** One fix line torch printed ("dy = Dim('dy', max=5)", "dx = dy + 1", "n = 4") as JSON. */
export function parseFix(line) {
  let m = FIX_DIM.exec(line.trim());
  if (m) {
    const dim = { name: m[2] };
    if (m[3] !== undefined) dim.min = Number(m[3]);
    if (m[4] !== undefined) dim.max = Number(m[4]);
    return { name: m[1], value: dim };
  }
  m = FIX_STATIC.exec(line.trim());
  if (m) return { name: m[1], value: Number(m[2]) };
  m = FIX_EXPR.exec(line.trim());
  if (m) {
    const expr = m[2].replace(/\s+/g, "");
    if (EXPRESSION.test(expr)) return { name: m[1], value: expr };
  }
  return null;
}

/**
 * The requested spec with torch's suggested fixes applied, in the contract's JSON form, or
 * null when a fix cannot be expressed. Each dimension named by a fix takes the fix's value.
 */
export function applySuggestedFixes(requested, lines) {
  if (!requested || typeof requested !== "object" || !lines?.length) return null;
  const fixes = new Map();
  for (const line of lines) {
    const fix = parseFix(line);
    if (!fix) return null;
    fixes.set(fix.name, fix.value);
  }
  const declaredNow = new Set();
  const replace = (dim) => {
    const name = dim && typeof dim === "object" && !Array.isArray(dim) && typeof dim.name === "string" ? dim.name : typeof dim === "string" && NAME.test(dim) && !KEYWORDS.has(dim) ? dim : null;
    if (name === null || !fixes.has(name)) return dim;
    const value = fixes.get(name);
    if (value && typeof value === "object") {
      if (declaredNow.has(value.name)) return value.name;
      declaredNow.add(value.name);
      return { ...value };
    }
    return value;
  };
  const walkSpec = (spec, isArg) => {
    if (Array.isArray(spec)) return spec.map((item) => walkSpec(item, false));
    if (spec && typeof spec === "object") {
      if (!isArg && typeof spec.name === "string") return replace(spec);
      return Object.fromEntries(Object.entries(spec).map(([k, v]) => [k, walkSpec(v, false)]));
    }
    return replace(spec);
  };
  const fixed = Object.fromEntries(Object.entries(requested).map(([k, v]) => [k, walkSpec(v, false)]));
  // A root that the fixes only use inside derived dims must be declared where it is used.
  const { errors } = checkDynamicShapes(JSON.stringify(fixed));
  const rooted = new Set();
  for (const error of errors) {
    const undeclared = /^"(\w+)" is used but never declared/.exec(error.message);
    if (!undeclared) return null;
    if (rooted.has(undeclared[1])) continue;
    rooted.add(undeclared[1]);
    const root = [...fixes.values()].find((v) => v && typeof v === "object" && v.name === undeclared[1]);
    if (!root || !declareAt(fixed, error.path, root)) return null;
  }
  return fixed;
}

function declareAt(spec, path, root) {
  const keys = path.replace(/\[(\d+)\]/g, ".$1").split(".").filter(Boolean);
  let parent = spec;
  for (const key of keys.slice(0, -1)) parent = parent?.[key];
  const last = keys[keys.length - 1];
  if (!parent || typeof parent[last] !== "string") return false;
  parent[last] = { ...root, expr: parent[last] };
  return true;
}
