// The upload form's fields for a generation-ready checkpoint (option `generation`): the
// static KV cache, its length, and the tokens generated to check each artifact.
import { h } from "./dom.js";

/** The tasks a checkpoint is made generation-ready for ("" infers the task, which may be one). */
export const GENERATION_TASKS = new Set(["", "text-generation", "text2text-generation", "automatic-speech-recognition"]);

const DEFAULT_NEW_TOKENS = 16;

/**
 * The fields, filled from `initial` (the options' `generation` of an earlier job): `element`
 * to place in the form, `value()` the options' `generation` object (only what differs from
 * the defaults; null when nothing does), `problems()` the values out of the contract's
 * ranges.
 */
export function generationFields(initial = {}) {
  const cache = h("input", { type: "checkbox", name: "generation_cache", id: "generation-cache", checked: initial?.cache !== false });
  const cacheLen = h("input", { type: "number", name: "max_cache_len", id: "max-cache-len", min: 32, max: 8192, step: 1, placeholder: "1024, or the model's context", value: initial?.max_cache_len ?? "" });
  const newTokens = h("input", { type: "number", name: "max_new_tokens", id: "max-new-tokens", min: 1, max: 256, step: 1, value: initial?.max_new_tokens ?? DEFAULT_NEW_TOKENS });
  const cacheRow = h("label", { class: "field" }, "KV cache length (tokens, prompt and generated)", cacheLen);
  const element = h("fieldset", { class: "generation", id: "generation-fields" },
    h("legend", {}, "Generation (text-generation, text2text-generation and speech-to-text checkpoints)"),
    h("label", { class: "check" }, cache, " export with a static KV cache: one program for the prompt and each next token (off: the plain forward)"),
    h("div", { class: "row" }, cacheRow,
      h("label", { class: "field" }, "tokens generated to check each artifact against eager transformers", newTokens)));
  const refresh = () => { cacheRow.hidden = !cache.checked; };
  cache.addEventListener("change", refresh);
  refresh();

  function value() {
    const body = {};
    if (!cache.checked) body.cache = false;
    if (cache.checked && cacheLen.value !== "") body.max_cache_len = Number(cacheLen.value);
    if (newTokens.value !== "" && Number(newTokens.value) !== DEFAULT_NEW_TOKENS) body.max_new_tokens = Number(newTokens.value);
    return Object.keys(body).length ? body : null;
  }

  function problems() {
    const found = [];
    const whole = (el, min, max) => el.value === "" || (Number.isInteger(Number(el.value)) && Number(el.value) >= min && Number(el.value) <= max);
    if (cache.checked && !whole(cacheLen, 32, 8192)) found.push({ field: "max_cache_len", code: "invalid_request", message: "The KV cache length must be a whole number from 32 to 8192." });
    if (!whole(newTokens, 1, 256)) found.push({ field: "max_new_tokens", code: "invalid_request", message: "Tokens generated must be a whole number from 1 to 256." });
    return found;
  }

  return { element, value, problems };
}
