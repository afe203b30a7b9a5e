"""The programs a deployment target's conversion runs, found by the worker (trusted, without
importing torch or the converters), so that the zygote's toolchain child (toolchain.py)
may execute exactly these files and nothing else (`Confinement.executables`, Landlock's
execute right). The job child itself never executes anything.

Measured with `strace -f -e trace=execve` (docs/targets.md):
- `onnx`: none.
- `aoti`: the C++ compiler driver (`g++`, found on the job's PATH as torch's inductor finds
  it), `cc1plus` and `cc1` (the weights' `.S` file is preprocessed by `cc1 -E`), `as`,
  `collect2` and `ld` — no `python -c` probe (the vector ISA is given). Not
  `lto-wrapper`: link-time optimization runs it with options read from object files,
  which the job writes.
- `executorch`: the `flatc` binary shipped in the executorch wheel.
Each executed ELF program also needs the dynamic loader (the kernel checks it like the
program). Nothing here is ever given to a job that asked for none of these targets.
"""

from __future__ import annotations

import functools
import importlib.util
import platform
import shutil
import subprocess
import sysconfig
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from engine.targets.registry import TARGETS

__all__ = ["JOB_PATH", "directories", "programs", "toolchain"]

JOB_PATH = "/usr/local/bin:/usr/bin:/bin"
"""The PATH a job child has (lockdown.environment)."""

_LOADERS = {
    "x86_64": "/lib64/ld-linux-x86-64.so.2",
    "aarch64": "/lib/ld-linux-aarch64.so.1",
}


def programs(targets: Iterable[str]) -> list[Path]:
    """The files a job converting to `targets` may execute (resolved, existing ones);
    empty when none of the targets runs a program."""
    found: set[Path] = set()
    for program in _toolchain(targets):
        found |= set(_FINDERS[program]())
    if found:
        found |= set(_resolved([_LOADERS.get(platform.machine(), "")]))
    return sorted(found)


def toolchain(targets: Iterable[str]) -> dict[str, Any]:
    """What the toolchain broker builds a job's commands from (toolchain_commands.py):
    the programs a job converting to `targets` may have run, by the name it asks with
    (`g++`, `flatc`: the compiler driver and flatc, never their helpers or the dynamic
    loader), and for `g++` the include and library directories of Python and torch, as
    torch's inductor names them. Empty when none of the targets runs a program."""
    found: dict[str, Any] = {}
    for program in _toolchain(targets):
        paths = _FINDERS[program]()
        if not paths:
            continue
        found[program] = str(paths[0])
        if program == "g++":
            found["include"], found["libdirs"] = directories()
    return found


def _toolchain(targets: Iterable[str]) -> list[str]:
    """The programs the targets' conversions run (their registry rows' `toolchain`)."""
    rows = [TARGETS[target] for target in targets if target in TARGETS]
    return sorted({program for row in rows for program in row.toolchain})


def directories() -> tuple[list[str], list[str]]:
    """Python's and torch's include and library directories, in inductor's order
    (`cpp_builder._get_python_related_args`, `cpp_extension.include_paths`), found without
    importing torch."""
    include = [sysconfig.get_path("include"), sysconfig.get_path("include", "posix_prefix")]
    libdirs = [str(sysconfig.get_config_var("LIBDIR"))]
    spec = importlib.util.find_spec("torch")
    if spec is not None and spec.submodule_search_locations:
        torch_dir = Path(next(iter(spec.submodule_search_locations)))
        include += [str(torch_dir / "include"), str(torch_dir / "include/torch/csrc/api/include")]
        libdirs.append(str(torch_dir / "lib"))
    return list(dict.fromkeys(include)), libdirs


@functools.cache
def _aoti() -> tuple[Path, ...]:
    """The driver first, then its helpers."""
    driver = shutil.which("g++", path=JOB_PATH)
    if driver is None:
        return ()
    names = []
    for helper in ("cc1plus", "cc1", "collect2"):
        try:
            answer = subprocess.run(
                [driver, f"-print-prog-name={helper}"],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            continue
        names.append(answer if "/" in answer else shutil.which(answer, path=JOB_PATH) or "")
    for tool in ("as", "ld", "ld.bfd"):
        names.append(shutil.which(tool, path=JOB_PATH) or "")
    resolved = Path(driver).resolve()
    return (resolved, *(path for path in _resolved(names) if path != resolved))


@functools.cache
def _executorch() -> tuple[Path, ...]:
    try:
        spec = importlib.util.find_spec("executorch")  # finds, never imports, the package
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return _resolved(
        [
            str(Path(location) / "data" / "bin" / "flatc")
            for location in spec.submodule_search_locations
        ]
    )


def _resolved(names: Iterable[str]) -> tuple[Path, ...]:
    paths = {Path(name).resolve() for name in names if name}
    return tuple(sorted(path for path in paths if path.is_file()))


_FINDERS = {"g++": _aoti, "flatc": _executorch}
"""How each toolchain program is found (the first path is the program itself)."""
