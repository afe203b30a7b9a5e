"""Zipping a `save_pretrained` directory for `torchport export DIR` and `torchport submit
DIR` (docs/contract.md §1, *Checkpoints*).

Only what the engine reads is sent: `config.json`, `generation_config.json`, the weights
(`*.safetensors`, `model.safetensors.index.json`; `pytorch_model*.bin` and its index only
when there is no safetensors file) and, for a checkpoint with its own code (`auto_map`),
its top-level `.py` files. Tokenizer files, optimizer states, READMEs and other files
stay behind.

A PEFT adapter goes with it as a sub-folder holding its `adapter_config.json` and
`adapter_model.safetensors`: each sub-folder of the directory that has an
`adapter_config.json`, or only the adapter directory `--adapter` names (anywhere on
disk). An adapter directory given as the model is zipped with its base when its
`base_model_name_or_path` is a local `save_pretrained` directory; alone otherwise, which
the engine refuses (`adapter_without_base`): nothing is downloaded.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable
from pathlib import Path

from schemas.model_zip import ADAPTER_CONFIG, ADAPTER_WEIGHTS, CONFIG

__all__ = [
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


def checkpoint_files(directory: Path) -> list[Path]:
    """The files of `directory` a checkpoint upload sends, sorted by name."""
    files = [directory / name for name in _ALWAYS if (directory / name).is_file()]
    safetensors = sorted(directory.glob("*.safetensors"))
    if safetensors:
        files += safetensors + sorted(directory.glob("model.safetensors.index.json"))
    else:
        files += sorted(directory.glob("pytorch_model*.bin"))
        files += sorted(directory.glob("pytorch_model.bin.index.json"))
    if _has_auto_map(directory / "config.json"):
        files += sorted(directory.glob("*.py"))
    return sorted((f for f in files if f.is_file()), key=lambda f: f.name)


def adapter_files(directory: Path) -> list[Path]:
    """The files of a PEFT adapter directory an upload sends (safetensors weights only)."""
    return [directory / n for n in (ADAPTER_CONFIG, ADAPTER_WEIGHTS) if (directory / n).is_file()]


def _read_json(path: Path) -> dict[str, object]:
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _has_auto_map(config: Path) -> bool:
    return bool(_read_json(config).get("auto_map"))


def _adapter_folders(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.is_dir() and (p / ADAPTER_CONFIG).is_file())


def _folder_name(directory: Path, adapter: Path) -> str:
    """The adapter's folder in the zip: its path inside the checkpoint, or its own name."""
    inside = adapter.resolve()
    if inside.is_relative_to(directory.resolve()) and inside != directory.resolve():
        return inside.relative_to(directory.resolve()).as_posix()
    return inside.name or "adapter"


def local_base(adapter: Path) -> Path | None:
    """The base checkpoint of an adapter directory when its `base_model_name_or_path` is
    a `save_pretrained` directory on this machine."""
    named = _read_json(adapter / ADAPTER_CONFIG).get("base_model_name_or_path")
    if not isinstance(named, str) or not named:
        return None
    for base in (Path(named).expanduser(), adapter / named):
        if (base / CONFIG).is_file():
            return base
    return None


def zip_checkpoint(
    directory: Path, dest_dir: Path, adapter: Path | None = None, *, name: str | None = None
) -> tuple[Path, list[str]]:
    """Zip the checkpoint files of `directory` into `dest_dir/<name>.zip` (the directory's
    name by default), with its adapter sub-folders, or only `adapter`'s files.

    Returns:
        The zip's path and the names of the files in it (config.json missing from them
        leaves the refusal to the engine or the server, which say why).
    """
    members = [(path, path.name) for path in checkpoint_files(directory)]
    for folder in [adapter] if adapter is not None else _adapter_folders(directory):
        prefix = _folder_name(directory, folder)
        members += [(path, f"{prefix}/{path.name}") for path in adapter_files(folder)]
    return _write_zip(dest_dir / f"{name or directory.resolve().name or 'checkpoint'}.zip", members)


def _write_zip(archive: Path, members: list[tuple[Path, str]]) -> tuple[Path, list[str]]:
    # Weights are compressed poorly and read whole by the engine: store them.
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        for path, member in members:
            zf.write(path, member)
    return archive, [member for _, member in members]


def upload_path(
    model: Path, zips: Path, say: Callable[[str], None], adapter: Path | None = None
) -> Path:
    """`model` itself, or for a directory (a `save_pretrained` checkpoint, or a PEFT
    adapter) a zip of the files the engine reads, made under `zips`, with `adapter` (a
    PEFT adapter directory) in it; `say` is told what was zipped.

    Raises:
        UnusableAdapter: `adapter` holds no adapter_config.json, or `model` is a file.
    """
    if adapter is not None:
        if not (adapter / ADAPTER_CONFIG).is_file():
            raise UnusableAdapter(f"{adapter} is no PEFT adapter directory (no {ADAPTER_CONFIG})")
        if not model.is_dir():
            raise UnusableAdapter(f"--adapter goes with a checkpoint directory; {model} is not one")
    if not model.is_dir():
        return model
    if adapter is None and not (model / CONFIG).is_file() and (model / ADAPTER_CONFIG).is_file():
        base = local_base(model)
        if base is None:  # sent alone: the engine says what is missing
            archive, names = _write_zip(
                zips / f"{model.resolve().name or 'adapter'}.zip",
                [(path, path.name) for path in adapter_files(model)],
            )
            say(f"adapter {model} without its base: sending {', '.join(names)}")
            return archive
        archive, names = zip_checkpoint(base, zips, model, name=model.resolve().name)
        say(f"adapter {model} with its base {base}: sending {', '.join(names)}")
        return archive
    archive, names = zip_checkpoint(model, zips, adapter)
    say(f"checkpoint {model}: sending {', '.join(names) or 'nothing'}")
    return archive
