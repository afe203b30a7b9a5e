// A table whose rows are built only while they are in view: a model with a thousand
// parameters lists them all, in a scrolling box, for the DOM of a few dozen rows.
import { h, table } from "./dom.js";

/** Up to this many rows a table is built whole. */
export const WHOLE = 40;
const ROW_HEIGHT = 27;
const OVERSCAN = 8;

/**
 * A table of `items`, each made a <tr> by `render(item)`; past WHOLE rows only the rows in view
 * (and a few either side) exist, between two spacer rows that keep the scroll height.
 */
export function longTable(columns, items, render, attrs = {}) {
  if (items.length <= WHOLE) return table(columns, items.map(render), attrs);
  const body = h("tbody", {});
  const box = h("div", { class: "long-table", "data-rows": String(items.length) },
    h("table", attrs, h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c)))), body));
  let shown = "";
  const spacer = (height) => h("tr", { class: "spacer", "aria-hidden": "true" }, h("td", { colspan: columns.length, style: `height: ${height}px; padding: 0; border: 0` }));
  const update = () => {
    const first = Math.max(0, Math.floor(box.scrollTop / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(items.length, Math.ceil((box.scrollTop + (box.clientHeight || 420)) / ROW_HEIGHT) + OVERSCAN);
    if (shown === `${first}:${last}`) return;
    shown = `${first}:${last}`;
    body.replaceChildren(spacer(first * ROW_HEIGHT), ...items.slice(first, last).map((item) => {
      const tr = render(item);
      tr.style.height = `${ROW_HEIGHT}px`;
      return tr;
    }), spacer((items.length - last) * ROW_HEIGHT));
  };
  let queued = false;
  box.addEventListener("scroll", () => {
    if (queued) return;
    queued = true;
    requestAnimationFrame(() => {
      queued = false;
      update();
    });
  });
  update();
  return box;
}
