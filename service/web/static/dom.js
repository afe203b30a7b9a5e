// Building DOM nodes without a framework: h("div", {class: "x"}, child, ...).

/** An element with attributes (on* keys become listeners) and children (strings become text). */
export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") {
      node.addEventListener(key.slice(2).toLowerCase(), value);
    } else if (key === "dataset") {
      Object.assign(node.dataset, value);
    } else if (value === true) {
      node.setAttribute(key, "");
    } else {
      node.setAttribute(key, String(value));
    }
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

/** Replace the children of `node`. */
export function fill(node, ...children) {
  node.replaceChildren();
  append(node, children);
  return node;
}

/** A card: a titled section of a page. */
export function card(title, ...children) {
  return h("section", { class: "card", "data-card": slug(title) }, h("h2", {}, title), ...children);
}

/** A table from column titles and rows of cells. */
export function table(columns, rows, attrs = {}) {
  return h(
    "table",
    attrs,
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))),
    h("tbody", {}, rows),
  );
}

export function slug(text) {
  return String(text).toLowerCase().replace(/[^a-z0-9]+/g, "-").replace(/^-|-$/g, "");
}

/** A shape as people write it: [s0, 64]. */
export function formatShape(shape) {
  if (shape === null || shape === undefined) return "—";
  return `[${shape.join(", ")}]`;
}

export function formatBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(1)} ${units[i]}`;
}

export function formatSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(2)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

export function formatError(value) {
  if (value === null || value === undefined) return "—";
  if (value === 0) return "0";
  return value.toExponential(2);
}

export function formatTime(iso) {
  if (!iso) return "—";
  return new Date(iso).toLocaleString();
}

/** A button that copies `text()` to the clipboard and says so. */
export function copyButton(text, label = "Copy") {
  const button = h("button", { type: "button", class: "small" }, label);
  button.addEventListener("click", async () => {
    const value = typeof text === "function" ? text() : text;
    try {
      await navigator.clipboard.writeText(value);
    } catch {
      // Clipboard access needs a secure context; select the text for Ctrl-C instead.
      const area = h("textarea", {}, value);
      document.body.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    button.textContent = "Copied";
    setTimeout(() => { button.textContent = label; }, 1500);
  });
  return button;
}

export function badge(status) {
  return h("span", { class: `badge status-${status}`, "data-status": status }, status);
}

/** Text whose `backticked` parts become <code>, as torchport's messages and hints write code. */
export function rich(text) {
  if (!text) return "";
  return String(text).split(/`([^`]+)`/).map((part, i) => (i % 2 ? h("code", {}, part) : part));
}
