"""Zipping a `save_pretrained` directory for `torchport export DIR` and `torchport submit
DIR` (docs/contract.md §1, *Checkpoints*).

Only what the engine reads is sent: `config.json`, `generation_config.json`, the
tokenizer's files (`schemas.model_zip.TOKENIZER_FILES`: written beside the artifacts),
the weights (`*.safetensors`, `model.safetensors.index.json`; `pytorch_model*.bin` and
its index only when there is no safetensors file) and, for a checkpoint with its own code
(`auto_map`), its top-level `.py` files. Optimizer states, READMEs and other files stay
behind.

A PEFT adapter goes with it as a sub-folder holding its `adapter_config.json` and
`adapter_model.safetensors`: each sub-folder of the directory that has an
`adapter_config.json`, or only the adapter directory `--adapter` names (anywhere on
disk). An adapter directory given as the model is zipped with its base when its
`base_model_name_or_path` is a local `save_pretrained` directory; alone otherwise, which
the engine refuses (`adapter_without_base`): nothing is downloaded.

What leaves the machine (`torchport submit`: a `Sending`) is only regular files inside
the directory the user named. A symbolic link among the files or adapter folders it would
send is refused (even one to a file beside it) unless `Sending.follow_links` names the
links (`--follow-links`); a device, pipe or socket is always refused; an adapter's base is
sent only when it lies inside the adapter directory, else the user names it (`torchport
submit BASE --adapter ADAPTER`). Each refusal is a `RefusedFile`, before anything is sent.
A local export (no `Sending`) sends nothing anywhere: it reads what links point to and
skips anything that is no regular file.
"""

from __future__ import annotations

import json
import shutil
import stat
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.model_zip import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    CONFIG,
    TOKENIZER_FILES,
    aligned_member,
)
from torchport.job_view import human_size

__all__ = [
    "RefusedFile",
    "Sending",
    "UnusableAdapter",
    "adapter_files",
    "checkpoint_files",
    "local_base",
    "upload_path",
    "zip_checkpoint",
]

_ALWAYS = ("config.json", "generation_config.json")


class UnusableAdapter(ValueError):
    """`--adapter` names no adapter directory, or goes with a model that is no directory."""


class RefusedFile(ValueError):
    """Something an upload would send that must not leave the machine; `details` says
    what: `reason` (`symlink`, `special_file`, or `outside_directory` for an adapter's
    base), `path`, and for a base, `base`."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.details = {key: str(value) for key, value in details.items()}


@dataclass(frozen=True)
class Sending:
    """The files go to a server: only regular files inside the directory."""

    follow_links: bool = False
    """Send what the links among the files point to (`--follow-links`) instead of refusing
    them; what they point to must still be a regular file."""


def _exists(path: Path) -> bool:
    return path.is_symlink() or path.exists()


def _taken(path: Path, sending: Sending | None) -> bool:
    """Whether `path`, one of the files an upload would send, goes with it: a regular file
    (a folder of that name is skipped). A local export follows links and skips anything
    else; an upload refuses a link (unless `follow_links`) and a device, pipe or socket.

    Raises:
        RefusedFile: while sending, `path` is a link or no regular file.
    """
    if sending is None:
        return path.is_file()
    if path.is_symlink() and not sending.follow_links:
        raise RefusedFile(f"{path} is a symbolic link", reason="symlink", path=path)
    try:
        mode = path.stat().st_mode
    except OSError:  # a dangling link, or gone since it was listed
        return False
    if stat.S_ISDIR(mode):
        return False
    if not stat.S_ISREG(mode):
        raise RefusedFile(f"{path} is no regular file", reason="special_file", path=path)
    return True


def checkpoint_files(directory: Path, sending: Sending | None = None) -> list[Path]:
    """The files of `directory` a checkpoint upload sends, sorted by name.

    Raises:
        RefusedFile: while `sending`, one of them is a link or no regular file.
    """
    files = [directory / name for name in (*_ALWAYS, *TOKENIZER_FILES) if _exists(directory / name)]
    safetensors = sorted(directory.glob("*.safetensors"))
    if safetensors:
        files += safetensors + sorted(directory.glob("model.safetensors.index.json"))
    else:
        files += sorted(directory.glob("pytorch_model*.bin"))
        files += sorted(directory.glob("pytorch_model.bin.index.json"))
    if _has_auto_map(directory / "config.json"):
        files += sorted(directory.glob("*.py"))
    return sorted((f for f in files if _taken(f, sending)), key=lambda f: f.name)


def adapter_files(directory: Path, sending: Sending | None = None) -> list[Path]:
    """The files of a PEFT adapter directory an upload sends (safetensors weights only).

    Raises:
        RefusedFile: while `sending`, one of them is a link or no regular file.
    """
    named = [directory / name for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS)]
    return [path for path in named if _exists(path) and _taken(path, sending)]


def _read_json(path: Path) -> dict[str, object]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _has_auto_map(config: Path) -> bool:
    return bool(_read_json(config).get("auto_map"))


def _adapter_folders(directory: Path, sending: Sending | None) -> list[Path]:
    """The sub-folders of `directory` that hold an adapter_config.json.

    Raises:
        RefusedFile: while `sending` (without `follow_links`), one of them is a link.
    """
    folders = [p for p in directory.iterdir() if p.is_dir() and (p / ADAPTER_CONFIG).is_file()]
    for folder in folders:
        if sending is not None and not sending.follow_links and folder.is_symlink():
            raise RefusedFile(f"{folder} is a symbolic link", reason="symlink", path=folder)
    return sorted(folders)


def _folder_name(directory: Path, adapter: Path) -> str:
    """The adapter's folder in the zip: its path inside the checkpoint, or its own name."""
    inside = adapter.resolve()
    if inside.is_relative_to(directory.resolve()) and inside != directory.resolve():
        return inside.relative_to(directory.resolve()).as_posix()
    return inside.name or "adapter"


def local_base(adapter: Path, sending: Sending | None = None) -> Path | None:
    """The base checkpoint of an adapter directory when its `base_model_name_or_path` is
    a `save_pretrained` directory on this machine.

    Raises:
        RefusedFile: while `sending`, that directory lies outside the adapter directory
            (the user names it instead: `torchport submit BASE --adapter ADAPTER`).
    """
    named = _read_json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
    if not isinstance(named, str) or not named:
        return None
    for base in (Path(named).expanduser(), adapter / named):
        if not (base / CONFIG).is_file():
            continue
        if sending is not None and not base.resolve().is_relative_to(adapter.resolve()):
            raise RefusedFile(
                f"the base of adapter {adapter} is {base}, outside it",
                reason="outside_directory",
                path=adapter,
                base=base,
            )
        return base
    return None


def zip_checkpoint(
    directory: Path,
    dest_dir: Path,
    adapter: Path | None = None,
    *,
    name: str | None = None,
    sending: Sending | None = None,
) -> tuple[Path, list[tuple[str, int]]]:
    """Zip the checkpoint files of `directory` into `dest_dir/<name>.zip` (the directory's
    name by default), with its adapter sub-folders, or only `adapter`'s files.

    Returns:
        The zip's path and the names and sizes of the files in it (config.json missing
        from them leaves the refusal to the engine or the server, which say why).

    Raises:
        RefusedFile: while `sending`, a file or folder it would send may not go.
    """
    members = [(path, path.name) for path in checkpoint_files(directory, sending)]
    folders = [adapter] if adapter is not None else _adapter_folders(directory, sending)
    for folder in folders:
        prefix = _folder_name(directory, folder)
        members += [(path, f"{prefix}/{path.name}") for path in adapter_files(folder, sending)]
    return _write_zip(dest_dir / f"{name or directory.resolve().name or 'checkpoint'}.zip", members)


def _write_zip(
    archive: Path, members: list[tuple[Path, str]]
) -> tuple[Path, list[tuple[str, int]]]:
    # Weights compress poorly: stored, each member's data 64-byte aligned, the engine maps
    # the safetensors where they lie in the zip instead of unpacking them.
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for path, member in members:
            info = aligned_member(member, zf.fp.tell() if zf.fp else 0)
            with path.open("rb") as src, zf.open(info, "w", force_zip64=True) as out:
                shutil.copyfileobj(src, out, 1024 * 1024)
        sizes = [(info.filename, info.file_size) for info in zf.infolist()]
    return archive, sizes


def _tell(say: Callable[[str], None], what: str, files: list[tuple[str, int]]) -> None:
    """Say what is zipped: a line, then each file with its size, a line each."""
    total = human_size(sum(size for _, size in files))
    lines = [f"{what}: sending {len(files)} file{'' if len(files) == 1 else 's'}, {total}"]
    lines += [f"  {member}  {human_size(size)}" for member, size in files]
    say("\n".join(lines))


def upload_path(
    model: Path,
    zips: Path,
    say: Callable[[str], None],
    adapter: Path | None = None,
    *,
    sending: Sending | None = None,
) -> Path:
    """`model` itself, or for a directory (a `save_pretrained` checkpoint, or a PEFT
    adapter) a zip of the files the engine reads, made under `zips`, with `adapter` (a
    PEFT adapter directory) in it; `say` is told what was zipped, over several lines (each
    file with its size). `sending`: the zip goes to a server (only regular files inside
    the directory, module docstring).

    Raises:
        UnusableAdapter: `adapter` holds no adapter_config.json, or `model` is a file.
        RefusedFile: while `sending`, a file or folder it would send may not go.
    """
    if adapter is not None:
        if not (adapter / ADAPTER_CONFIG).is_file():
            raise UnusableAdapter(f"{adapter} is no PEFT adapter directory (no {ADAPTER_CONFIG})")
        if not model.is_dir():
            raise UnusableAdapter(f"--adapter goes with a checkpoint directory; {model} is not one")
    if not model.is_dir():
        return model
    if adapter is None and not (model / CONFIG).is_file() and (model / ADAPTER_CONFIG).is_file():
        base = local_base(model, sending)
        if base is None:  # sent alone: the engine says what is missing
            archive, files = _write_zip(
                zips / f"{model.resolve().name or 'adapter'}.zip",
                [(path, path.name) for path in adapter_files(model, sending)],
            )
            _tell(say, f"adapter {model} without its base", files)
            return archive
        archive, files = zip_checkpoint(
            base, zips, model, name=model.resolve().name, sending=sending
        )
        _tell(say, f"adapter {model} with its base {base}", files)
        return archive
    archive, files = zip_checkpoint(model, zips, adapter, sending=sending)
    _tell(say, f"checkpoint {model}", files)
    return archive
