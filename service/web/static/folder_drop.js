// What a drop on the upload form holds: files, or a folder (a `save_pretrained` checkpoint
// dragged from the file manager). A dropped folder reaches the page only as an entry of
// the File and Directory Entries API (`DataTransferItem.webkitGetAsEntry`), whose files
// are read here with their paths below the folder, as a chosen folder's
// (`webkitRelativePath`) are; `dataTransfer.files` holds the folder itself as one
// unreadable "file".

/** The most files read from a dropped folder (the contract's most entries of a zip). */
const MAX_FILES = 10_000;

/**
 * The drop's contents, read from the event while it is dispatched (entries are readable
 * only then): `{folder, items}` for a dropped folder (its name; a promise of the `{file,
 * path}` of every file below it, `path` relative to it) or `{folder: null, files}` for
 * dropped files.
 */
export function dropContents(dataTransfer) {
  const entries = [...(dataTransfer.items || [])]
    .filter((item) => item.kind === "file")
    .map((item) => (item.webkitGetAsEntry ? item.webkitGetAsEntry() : null));
  const folder = entries.find((entry) => entry?.isDirectory);
  if (folder) return { folder: folder.name, items: folderFiles(folder) };
  return { folder: null, files: [...(dataTransfer.files || [])] };
}

/** Every file below a directory entry, `{file, path}` with `path` relative to it. */
async function folderFiles(directory) {
  const found = [];
  const pending = [[directory, ""]];
  while (pending.length) {
    const [dir, prefix] = pending.shift();
    for (const entry of await allEntries(dir)) {
      const path = `${prefix}${entry.name}`;
      if (entry.isDirectory) pending.push([entry, `${path}/`]);
      else if (entry.isFile) found.push({ file: await new Promise((resolve, reject) => entry.file(resolve, reject)), path });
      if (found.length > MAX_FILES) throw new RangeError(`the folder holds over ${MAX_FILES} files`);
    }
  }
  return found;
}

/** A directory reader answers in batches (100 in Chromium) until it answers none. */
async function allEntries(directory) {
  const reader = directory.createReader();
  const all = [];
  for (;;) {
    const batch = await new Promise((resolve, reject) => reader.readEntries(resolve, reject));
    if (!batch.length) return all;
    all.push(...batch);
  }
}
