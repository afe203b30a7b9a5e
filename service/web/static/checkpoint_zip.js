// Checkpoint zips in the browser: whether a chosen zip is a `save_pretrained` checkpoint
// (the contract's rule, schemas/model_zip.py, read off the zip's central directory), and a
// zip of a chosen folder, built with the "store" method (weights do not compress) as a Blob
// of the files themselves, so a multi-GB folder is never copied into memory.

const CHECKPOINT_FILE = /^(config\.json|generation_config\.json|.+\.safetensors|model\.safetensors\.index\.json)$/;
// The tokenizer's files (schemas/model_zip.py TOKENIZER_FILES): written beside the artifacts.
const TOKENIZER_FILE = /^(tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json|tokenizer\.model|vocab\.json|vocab\.txt|merges\.txt|chat_template\.jinja)$/;
const BIN_FILE = /^(pytorch_model.*\.bin|pytorch_model\.bin\.index\.json)$/;
const ADAPTER_CONFIG = "adapter_config.json";
const ADAPTER_WEIGHTS = "adapter_model.safetensors";
const ADAPTER_FILE = /^(adapter_config\.json|adapter_model\.safetensors)$/;
const MAX_ZIP32 = 0xffffffff;

function memberParts(name) {
  return name.replaceAll("\\", "/").split("/").filter((part) => part !== "" && part !== ".");
}

/** The files a zip of these member names unpacks to, as the engine names them. */
function unpackedFiles(names) {
  const files = new Set();
  for (const name of names) {
    const parts = memberParts(name);
    if (!parts.length || name.endsWith("/") || parts[0] === "__MACOSX") continue;
    files.add(parts.join("/"));
  }
  return [...files].sort();
}

/** Whether a zip of these member names is a checkpoint: its base level (the root, or the
 * one folder it holds) has a config.json and no model.py. */
export function isCheckpoint(names) {
  const files = unpackedFiles(names);
  const tops = new Set(files.map((f) => f.split("/", 1)[0]));
  const base = tops.size === 1 && files.length && files.every((f) => f.includes("/")) ? `${[...tops][0]}/` : "";
  return files.includes(`${base}config.json`) && !files.includes(`${base}model.py`);
}

/** The member names of a zip file, read from its central directory (null when it is not
 * a zip this reader understands; the server then decides). */
export async function zipNames(file) {
  const tailSize = Math.min(file.size, 22 + 65535);
  const tail = new DataView(await file.slice(file.size - tailSize).arrayBuffer());
  let end = -1;
  for (let i = tailSize - 22; i >= 0; i--) {
    if (tail.getUint32(i, true) === 0x06054b50) {
      end = i;
      break;
    }
  }
  if (end < 0) return null;
  const count = tail.getUint16(end + 10, true);
  const size = tail.getUint32(end + 12, true);
  const offset = tail.getUint32(end + 16, true);
  if (count === 0xffff || offset === MAX_ZIP32 || offset + size > file.size) return null; // zip64
  const directory = new DataView(await file.slice(offset, offset + size).arrayBuffer());
  const decoder = new TextDecoder();
  const names = [];
  let at = 0;
  for (let n = 0; n < count; n++) {
    if (at + 46 > size || directory.getUint32(at, true) !== 0x02014b50) return null;
    const nameLength = directory.getUint16(at + 28, true);
    const extra = directory.getUint16(at + 30, true);
    const comment = directory.getUint16(at + 32, true);
    names.push(decoder.decode(new Uint8Array(directory.buffer, directory.byteOffset + at + 46, nameLength)));
    at += 46 + nameLength + extra + comment;
  }
  return names;
}

/** The path of a chosen folder's file below the folder itself (`lora/adapter_config.json`). */
function innerPath(file) {
  const parts = (file.webkitRelativePath || file.name).split("/");
  return parts.length > 1 ? parts.slice(1).join("/") : parts[0];
}

/** The files of a chosen folder (`webkitdirectory`) a checkpoint needs, as `torchport
 * submit DIR` picks them (torchport/checkpoints.py): config, generation config, the
 * tokenizer's files, safetensors and their index (the .bin weights only without
 * safetensors; the top-level .py files only with `auto_map`), and each sub-folder holding an `adapter_config.json` as a PEFT adapter:
 * its adapter_config.json and adapter_model.safetensors. A folder that is an adapter itself
 * (no config.json) sends its two files alone, which the server refuses without its base
 * (`adapter_without_base`), as it refuses the CLI's. Takes the Files of a chosen folder or
 * the `{file, path}` of a dropped one; returns `{file, path}` entries, `path` below the
 * folder, in the CLI's order. */
export async function checkpointFiles(fileList) {
  // a chosen folder's Files, or a dropped folder's {file, path} (folder_drop.js)
  const entries = [...fileList].map((item) => (item instanceof File ? { file: item, path: innerPath(item) } : item));
  const top = entries.filter((e) => !e.path.includes("/"));
  const named = (re) => top.filter((e) => re.test(e.path)).sort(byPath);
  const config = top.find((e) => e.path === "config.json");
  if (!config && top.some((e) => e.path === ADAPTER_CONFIG)) return named(ADAPTER_FILE);
  let files = named(CHECKPOINT_FILE);
  if (!files.some((e) => e.path.endsWith(".safetensors"))) files = files.concat(named(BIN_FILE));
  files = files.concat(named(TOKENIZER_FILE));
  if (config) {
    try {
      if (JSON.parse(await config.file.text()).auto_map) files = files.concat(named(/\.py$/));
    } catch {
      // An unreadable config.json travels as it is; the engine says what is wrong with it.
    }
  }
  files.sort(byPath);
  const adapters = entries
    .filter((e) => e.path.split("/").length === 2 && e.path.endsWith(`/${ADAPTER_CONFIG}`))
    .map((e) => e.path.split("/")[0])
    .sort();
  for (const folder of adapters) {
    for (const name of [ADAPTER_CONFIG, ADAPTER_WEIGHTS]) {
      const found = entries.find((e) => e.path === `${folder}/${name}`);
      if (found) files.push(found);
    }
  }
  return files;
}

function byPath(a, b) {
  return a.path < b.path ? -1 : a.path > b.path ? 1 : 0;
}

const CRC_TABLE = (() => {
  const table = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    table[n] = c >>> 0;
  }
  return table;
})();

async function crc32(file) {
  let crc = 0xffffffff;
  const reader = file.stream().getReader();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    for (let i = 0; i < value.length; i++) crc = CRC_TABLE[(crc ^ value[i]) & 0xff] ^ (crc >>> 8);
  }
  return (crc ^ 0xffffffff) >>> 0;
}

function header(size, fields) {
  const view = new DataView(new ArrayBuffer(size));
  let at = 0;
  for (const [bytes, value] of fields) {
    if (bytes === 4) view.setUint32(at, value, true);
    else view.setUint16(at, value, true);
    at += bytes;
  }
  return new Uint8Array(view.buffer);
}

/** A zip File named `name` holding each `{file, path}` entry as `folder/path`, stored (not
 * compressed). Refuses (throws RangeError) what would need zip64: over 4 GiB, which no
 * server's default limit admits either. */
export async function storedZip(name, folder, entries) {
  const encoder = new TextEncoder();
  const parts = [];
  const central = [];
  let offset = 0;
  for (const { file, path: inner } of entries) {
    const path = encoder.encode(`${folder}/${inner}`);
    const crc = await crc32(file);
    const common = [[2, 20], [2, 0x0800], [2, 0], [2, 0], [2, 0x21], [4, crc], [4, file.size], [4, file.size], [2, path.length], [2, 0]];
    const local = header(30, [[4, 0x04034b50], ...common]);
    if (offset + local.length + path.length + file.size > MAX_ZIP32) throw new RangeError("the folder is over 4 GiB");
    central.push(header(46, [[4, 0x02014b50], [2, 0x0314], ...common, [2, 0], [2, 0], [2, 0], [4, 0o100644 << 16], [4, offset]]), path);
    parts.push(local, path, file);
    offset += local.length + path.length + file.size;
  }
  const centralSize = central.reduce((sum, part) => sum + part.length, 0);
  const end = header(22, [[4, 0x06054b50], [2, 0], [2, 0], [2, entries.length], [2, entries.length], [4, centralSize], [4, offset], [2, 0]]);
  return new File([...parts, ...central, end], name, { type: "application/zip" });
}
