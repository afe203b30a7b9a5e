"""Threads in the zygote: keeping libraries from starting them, and naming those that do.

A forked child gets only the thread that called fork. A thread the zygote started
before forking (a monitor, a pool worker) is missing in every child, and whatever it
held or was to do never happens: a child that waits for it hangs. So the zygote
refuses to serve when its warm-up leaves a new thread behind, and says which one.

Known starters are neutralised before the warm-up:
- tqdm starts a `TMonitor` thread in the constructor of its first progress bar, even a
  disabled one (`torch.fx.Interpreter.run` makes one through `torch.hub.tqdm`);
  `tqdm.std.tqdm.monitor_interval = 0` turns the monitor off. tqdm comes with
  transformers, huggingface_hub, timm and diffusers.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from dataclasses import dataclass


def quiet_libraries() -> list[str]:
    """Switch off the threads known libraries would start; returns what was switched."""
    done = []
    if importlib.util.find_spec("tqdm") is not None:
        import tqdm.std

        tqdm.std.tqdm.monitor_interval = 0
        done.append("tqdm monitor")
    return done


def task_ids() -> set[int]:
    """The kernel's thread ids of this process."""
    return {int(name) for name in os.listdir("/proc/self/task")}


@dataclass(frozen=True)
class NewThread:
    tid: int
    name: str
    module: str | None
    """The Python module that defines the thread's code, for a Python thread."""

    def __str__(self) -> str:
        return f"{self.name!r} (from {self.module})" if self.module else repr(self.name)


def started_since(before: set[int]) -> list[NewThread]:
    """The threads alive now that were not in `before` (from `task_ids()`)."""
    python = {t.native_id: t for t in threading.enumerate() if t.native_id is not None}
    found = []
    for tid in sorted(task_ids() - before):
        thread = python.get(tid)
        if thread is not None:
            found.append(NewThread(tid, thread.name, _module_of(thread)))
            continue
        try:
            with open(f"/proc/self/task/{tid}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            continue  # it ended meanwhile
        found.append(NewThread(tid, name, None))
    return found


def _module_of(thread: threading.Thread) -> str | None:
    target = getattr(thread, "_target", None)
    if target is not None:
        return getattr(target, "__module__", None)
    if type(thread).run is not threading.Thread.run:
        return type(thread).__module__
    return None


def refusal(threads: list[NewThread]) -> str:
    """The zygote's start-up error for threads its warm-up left behind."""
    names = ", ".join(str(t) for t in threads)
    modules = sorted({t.module.split(".")[0] for t in threads if t.module})
    culprit = (
        f"the library {', '.join(modules)} started it"
        if modules
        else "a native library (not Python code) started it"
    )
    return (
        f"the warm-up started threads, so forked jobs would hang: {names}; {culprit}. "
        "Pin that library to a version that does not start threads at import, or uninstall "
        "it from the worker's environment, and report it to torchport "
        "(worker.sandbox.zygote.threads.quiet_libraries neutralises known ones)."
    )
