"""What a model zip holds, decided from its member names alone: code or a checkpoint.

A checkpoint (docs/contract.md §1, *Checkpoints*) is a zip without the `entry` option
whose base level (its root, or the one folder it holds) has a `config.json` and no
`model.py`. The API decides it from the zip's directory before anything runs, to pick the
size limits a checkpoint gets; the engine decides it from the same names before it
unpacks, and again on the files unpacked. One rule, written once, here: plain Python.

A checkpoint may carry a PEFT adapter (`adapter_config.json` and
`adapter_model.safetensors`, as `PeftModel.save_pretrained` writes them) in a sub-folder
of its base level, merged into the model before export. A zip whose base level is an
adapter alone (`adapter_config.json`, no `config.json`) lacks the base model.
"""

from __future__ import annotations

import zipfile
from collections.abc import Iterable

CONFIG = "config.json"
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "chat_template.jinja",
)
"""A checkpoint's tokenizer files at its base level, as `save_pretrained` of a tokenizer
writes them: uploaded with the checkpoint and written beside the artifacts (the runtimes'
generation loops read them)."""
TOKENIZER_MAX_BYTES = 64 * 1024 * 1024
"""The largest tokenizer file taken (Gemma 3's `tokenizer.json` is 33 MB)."""
IGNORED_TOP_FOLDERS = frozenset({"__MACOSX"})
"""Folders a zip's unpacked files never include (macOS's resource forks)."""

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "ALIGNMENT",
    "CONFIG",
    "IGNORED_TOP_FOLDERS",
    "TOKENIZER_FILES",
    "TOKENIZER_MAX_BYTES",
    "adapter_folders",
    "adapter_only_base",
    "aligned_member",
    "base_level",
    "checkpoint_base",
    "member_parts",
    "unpacked_files",
]


def member_parts(name: str) -> list[str]:
    """The path of a zip entry as the engine unpacks it: `/` or `\\` separated, without
    empty and `.` parts (so `./pkg/net.py` is `pkg/net.py`)."""
    return [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]


def unpacked_files(names: Iterable[str]) -> list[str]:
    """The relative paths of the regular files a zip of these member names unpacks to,
    sorted: directories (names ending in `/`) and `__MACOSX/` left out."""
    files = set()
    for name in names:
        parts = member_parts(name)
        if not parts or name.endswith("/") or parts[0] in IGNORED_TOP_FOLDERS:
            continue
        files.add("/".join(parts))
    return sorted(files)


def base_level(files: list[str]) -> str:
    """The folder a zip's content is looked for in: "" for the root, or `"top/"` when
    every file lies in one top folder."""
    tops = {f.split("/", 1)[0] for f in files}
    if len(tops) == 1 and files and all("/" in f for f in files):
        return next(iter(tops)) + "/"
    return ""


def checkpoint_base(files: list[str], entry: str | None) -> str | None:
    """The checkpoint's folder among a zip's unpacked `files` ("" or `"top/"`), or None
    when they are model code (or `entry` names an entry file)."""
    if entry is not None:
        return None
    base = base_level(files)
    if f"{base}{CONFIG}" in files and f"{base}model.py" not in files:
        return base
    return None


def adapter_folders(files: list[str], base: str) -> list[str]:
    """The sub-folders of the checkpoint's `base` ("" or `"top/"`) that hold an
    `adapter_config.json` directly (`"adapter"`, relative to `base`), sorted."""
    found = set()
    for name in files:
        if not name.startswith(base):
            continue
        parts = name[len(base) :].split("/")
        if len(parts) == 2 and parts[1] == ADAPTER_CONFIG:
            found.add(parts[0])
    return sorted(found)


def adapter_only_base(files: list[str], entry: str | None) -> str | None:
    """The base level ("" or `"top/"`) of a zip that holds a PEFT adapter but neither its
    base checkpoint (`config.json`) nor Python source, or None for any other zip."""
    if entry is not None or any(f.endswith(".py") for f in files):
        return None
    base = base_level(files)
    if f"{base}{ADAPTER_CONFIG}" in files and f"{base}{CONFIG}" not in files:
        return base
    return None


ALIGNMENT = 64
"""Where the data of a member torchport writes starts: a multiple of this, so the engine
maps a checkpoint's safetensors from the zip in place (`engine/load/checkpoint/in_archive`)."""
_PADDING_FIELD = 0xD935
"""The extra field zipalign pads with."""


def aligned_member(name: str, offset: int) -> zipfile.ZipInfo:
    """The `ZipInfo` of a stored member whose local header goes at `offset`, padded so its
    data starts at a multiple of `ALIGNMENT` when written with
    `ZipFile.open(info, "w", force_zip64=True)` (whose header carries 20 bytes of zip64
    sizes after this extra field)."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    fixed = 30 + len(name.encode("utf-8")) + 4 + 20
    padding = -(offset + fixed) % ALIGNMENT
    info.extra = _PADDING_FIELD.to_bytes(2, "little") + padding.to_bytes(2, "little")
    info.extra += bytes(padding)
    return info
