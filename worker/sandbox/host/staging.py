"""A job's staging directory under `jobs_root`: made before the job (the uploads copied
in, the options and the job child's spec as files, all owned by the job's uid) and
removed after it, off the job's critical path (`Cleaner`).

Uploads are written there once, straight from where they are (a local file, the
worker's store), never through another copy. It is the only writable place a job can
see: `in`, `out`, `tmp/work` for the job child, `tmp/loader` for its round-trip loader.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from schemas import ExportOptions
from schemas.job import UPLOAD_ROLES
from worker.sandbox.protocol import JOB_SPEC
from worker.sandbox.settings import SandboxJob, SandboxSettings

Sizing = Callable[[int], tuple[ExportOptions, SandboxSettings]]
"""The job's options and settings, from its uploads' bytes."""

__all__ = ["Cleaner", "stage"]


def stage(
    job: SandboxJob,
    staging: Path,
    ids: tuple[int, int] | None,
    timeout_s: float | None = None,
    size: Sizing | None = None,
) -> tuple[ExportOptions, SandboxSettings | None]:
    """Write the uploads straight into a fresh directory only this job's uid can enter
    (each a copy of its own: the job's uid will own it), and the job child's spec
    (`JOB_SPEC`: paths of the uploads, the options file, its out and work dirs, and
    `timeout_s`, the time limit the worker holds it to). The options written are those
    `size` makes of the uploads' bytes (`supervisor.sized`), and are returned with the
    settings it gave (the job's own as they are, and None, without `size`)."""
    dirs = {name: staging / name for name in ("in", "out", "tmp")}
    for path in (staging, *dirs.values(), dirs["tmp"] / "loader", dirs["tmp"] / "work"):
        path.mkdir(mode=0o700)
    options_file = staging / "options.json"
    spec: dict[str, Any] = {"options_file": str(options_file), "timeout_s": timeout_s}
    uploads = job.uploads()
    upload_bytes = 0
    for role in UPLOAD_ROLES:
        source = uploads.get(role)
        if source is None:
            spec[role] = None
            continue
        # The model under its own name (its module's); each other upload in a folder of
        # its role, so an inputs and a calibration file of the same name both arrive.
        target = dirs["in"] / source.name
        if role != "model":
            target = dirs["in"] / role / source.name
            target.parent.mkdir(mode=0o700)
        source.copy_to(target)
        upload_bytes += target.stat().st_size
        spec[role] = str(target)
    options, settings = size(upload_bytes) if size is not None else (job.options, None)
    # The options go by file: valid options may exceed a control message (64 KiB).
    options_file.write_text(options.model_dump_json())
    spec["out_dir"], spec["work_dir"] = str(dirs["out"]), str(dirs["tmp"] / "work")
    (staging / JOB_SPEC).write_text(json.dumps(spec))
    if ids is not None:
        for dirpath, _dirnames, filenames in os.walk(staging):
            os.chown(dirpath, *ids)
            for filename in filenames:
                os.chown(os.path.join(dirpath, filename), *ids)
    return options, settings


class Cleaner:
    """Deletes finished jobs' staging directories off the jobs' critical path: each is
    renamed into `trash` (the job's processes are all gone by then) and deleted by one
    background thread. Deleting one took 1-15 ms here (ext4 with online discard).
    Whatever a crashed worker left in `trash` is deleted when the next one starts."""

    def __init__(self, trash: Path) -> None:
        shutil.rmtree(trash, ignore_errors=True)
        trash.mkdir(mode=0o700, parents=True)
        self.trash = trash
        self._queue: queue.SimpleQueue[Path | None] = queue.SimpleQueue()
        self._pending = 0
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sandbox-cleaner", daemon=True)
        self._thread.start()

    def remove(self, directory: Path) -> None:
        target = self.trash / directory.name
        try:
            os.rename(directory, target)
        except FileNotFoundError:
            return
        except OSError:
            shutil.rmtree(directory, ignore_errors=True)
            return
        with self._idle:
            self._pending += 1
        self._queue.put(target)

    def flush(self, timeout: float | None = None) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._pending == 0, timeout)

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (directory := self._queue.get()) is not None:
            shutil.rmtree(directory, ignore_errors=True)
            with self._idle:
                self._pending -= 1
                self._idle.notify_all()
