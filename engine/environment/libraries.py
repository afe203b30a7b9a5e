"""The third-party libraries of this interpreter: what is installed, what loads, what an
upload imported, and whether an upload's `requires` are met.

Never imports torch (or any library it describes): versions come from package metadata
(`importlib.metadata`), and whether a library loads is checked by importing it in a
fresh interpreter started like the sandbox's zygote (`python -I`, a scrubbed
environment), with a time limit. The worker (at start) and `torchport env` use
`describe_environment` (which also says whether each deployment target works, from
`engine.environment.target_requirements`); the export pipeline uses `imported_libraries` and
`check_requirements` in its loading stage.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from engine.environment import target_requirements
from schemas import MODEL_LIBRARIES, EnvironmentDescription, LibraryInfo

OUR_PACKAGES = frozenset({"engine", "schemas", "service", "worker", "torchport"})
"""torchport's own top-level packages, never reported as an upload's libraries."""

LOAD_CHECKS: dict[str, str] = {
    "torch": "import torch",
    "torchvision": "import torchvision, torchvision.ops",
    # transformers and diffusers import lazily: touching a model base class loads the
    # modeling code and torch, which is where a mismatch with torch shows.
    "transformers": "import transformers; transformers.PreTrainedModel",
    "diffusers": "import diffusers; diffusers.ModelMixin",
    "peft": "import peft",
    "timm": "import timm; timm.create_model",
    "huggingface-hub": "import huggingface_hub",
    "tokenizers": "import tokenizers",
    "safetensors": "import safetensors",
    "numpy": "import numpy",
}
"""How each model library is checked: the statement run in the fresh interpreter."""

_TARGET_CHECK = "target:"
"""Prefix of a deployment target's import check among the libraries' (`target:onnx`)."""

CHECK_TIMEOUT_S = 180.0
"""The import checks together may take this long (torch alone takes seconds)."""

_PROBE = r"""
import json, os, sys, time, warnings
try:
    os.nice(10)  # a worker starting up is running jobs meanwhile
except OSError:
    pass
warnings.simplefilter("ignore")
for name, statement in json.loads(sys.argv[1]):
    started = time.perf_counter()
    try:
        exec(statement, {})
        result = {"name": name, "ok": True}
    except BaseException as exc:
        result = {"name": name, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
    result["seconds"] = round(time.perf_counter() - started, 3)
    print(json.dumps(result), flush=True)
"""


def _metadata_name(dist: metadata.Distribution) -> str:
    name = dist.metadata["Name"]
    return str(name) if name else ""


def installed_distributions() -> dict[str, metadata.Distribution]:
    """Every installed distribution, by canonical name (the first on sys.path wins)."""
    found: dict[str, metadata.Distribution] = {}
    for dist in metadata.distributions():
        name = _metadata_name(dist)
        if name:
            found.setdefault(canonicalize_name(name), dist)
    return found


def _top_level_modules(dist: metadata.Distribution) -> list[str]:
    declared = dist.read_text("top_level.txt")
    if declared:
        return sorted({line.strip() for line in declared.splitlines() if line.strip()})
    tops = set()
    for file in dist.files or ():
        parts = file.parts
        if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or ".." in parts:
            continue
        if len(parts) == 1:
            if file.suffix == ".py":
                tops.add(file.stem)
            elif file.suffix in (".so", ".pyd"):
                tops.add(file.name.split(".")[0])
        elif parts[0] != "__pycache__":
            tops.add(parts[0])
    return sorted(top for top in tops if top.isidentifier())


@dataclass(frozen=True)
class CheckResult:
    """Whether one library's load check passed, and why not."""

    ok: bool | None
    error: str | None = None


def check_imports(
    checks: dict[str, str],
    *,
    timeout_s: float = CHECK_TIMEOUT_S,
    python: str | None = None,
) -> dict[str, CheckResult]:
    """Run each `name → statement` in one fresh interpreter, in order, within `timeout_s`.

    The interpreter starts isolated (`-I`: no user site, no PYTHONPATH, no current
    directory) with a scrubbed environment, as the sandbox's zygote does, so what
    imports here imports in a job. A statement still running at the limit is reported
    as timed out; the ones after it as not checked (`ok` None).
    """
    results: dict[str, CheckResult] = {}
    if not checks:
        return results
    with tempfile.TemporaryDirectory(prefix="torchport-env-") as home:
        environment = {
            "PATH": "/usr/local/bin:/usr/bin:/bin",
            "HOME": home,
            "LANG": "C.UTF-8",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
        try:
            process = subprocess.run(
                [python or sys.executable, "-I", "-c", _PROBE, json.dumps(list(checks.items()))],
                capture_output=True,
                text=True,
                env=environment,
                cwd=home,
                timeout=timeout_s,
                check=False,
            )
            stdout, stderr, timed_out = process.stdout, process.stderr, False
        except subprocess.TimeoutExpired as exc:
            stdout = _text(exc.stdout)
            stderr, timed_out = _text(exc.stderr), True
    for line in stdout.splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and item.get("name") in checks:
            results[item["name"]] = CheckResult(bool(item.get("ok")), item.get("error"))
    pending = [name for name in checks if name not in results]
    if pending:
        if timed_out:
            why = f"the import did not finish in {timeout_s:g} s"
            results[pending[0]] = CheckResult(False, why)
        else:
            last = stderr.strip().splitlines()[-1:] or ["no output"]
            results[pending[0]] = CheckResult(False, f"the interpreter died: {last[0][:300]}")
        for name in pending[1:]:
            results[name] = CheckResult(None)
    return results


def _check_cache(installed: dict[str, metadata.Distribution], python: str | None) -> Path:
    """Where the import checks of exactly this interpreter and these distributions (names
    and versions) are kept: the checks take ~15 s, and every worker start would repeat
    them for nothing."""
    key = json.dumps(
        [python or sys.executable, sorted((name, d.version) for name, d in installed.items())]
    )
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    digest = hashlib.sha256(key.encode()).hexdigest()[:32]
    return Path(base) / "torchport" / f"import-checks-{digest}.json"


def _cached_checks(cache: Path | None, checks: dict[str, str]) -> dict[str, CheckResult] | None:
    if cache is None:
        return None
    try:
        data = json.loads(cache.read_text())
        found = {name: CheckResult(bool(data[name][0]), data[name][1]) for name in checks}
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None
    return found


def _store_checks(cache: Path | None, checked: dict[str, CheckResult]) -> None:
    """Keep complete answers only (none timed out or left unchecked)."""
    if cache is None or any(
        r.ok is None or "did not finish" in (r.error or "") for r in checked.values()
    ):
        return
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({n: [r.ok, r.error] for n, r in checked.items()}))
        os.replace(tmp, cache)
    except OSError:
        pass


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value or ""


def describe_environment(
    *,
    check: bool = True,
    timeout_s: float = CHECK_TIMEOUT_S,
    python: str | None = None,
    cached_only: bool = False,
) -> EnvironmentDescription:
    """torch, Python and every installed distribution; with `check`, whether each model
    library loads (see `check_imports`; the installed ones only). `cached_only` answers
    the checks only from the answers kept for exactly these distributions, starting no
    interpreter: a quick description (imports `None` when none are kept) a worker records
    at once at start, before the checks that take seconds."""
    installed = installed_distributions()
    checks: dict[str, str] = {}
    if check:
        checks = {name: LOAD_CHECKS[name] for name in MODEL_LIBRARIES if name in installed}
        # each target whose modules are all there: do they import too?
        checks.update(
            {
                _TARGET_CHECK + name: statement
                for name, statement in target_requirements.IMPORT_CHECKS.items()
                if not target_requirements.missing(name)
            }
        )
    started = time.perf_counter()
    cache = _check_cache(installed, python) if checks else None
    checked = _cached_checks(cache, checks)
    if checks and checked is None and not cached_only:
        checked = check_imports(checks, timeout_s=timeout_s, python=python)
        _store_checks(cache, checked)
    answered = checked is not None
    checked = checked or {}
    duration = time.perf_counter() - started if checks and answered else None
    libraries = []
    for name in MODEL_LIBRARIES:
        dist = installed.get(name)
        if dist is None:
            libraries.append(
                LibraryInfo(name=name, model_library=True, imports=False, error="not installed")
            )
            continue
        result = checked.get(name, CheckResult(None))
        libraries.append(
            LibraryInfo(
                name=_metadata_name(dist),
                version=dist.version,
                model_library=True,
                modules=_top_level_modules(dist),
                imports=result.ok,
                error=result.error,
            )
        )
    others = [dist for key, dist in installed.items() if key not in MODEL_LIBRARIES]
    for dist in sorted(others, key=lambda d: _metadata_name(d).lower()):
        libraries.append(
            LibraryInfo(
                name=_metadata_name(dist), version=dist.version, modules=_top_level_modules(dist)
            )
        )
    torch = installed.get("torch")
    ours = installed.get("torchport")
    target_imports = {
        name.removeprefix(_TARGET_CHECK): (result.ok, result.error)
        for name, result in checked.items()
        if name.startswith(_TARGET_CHECK)
    }
    return EnvironmentDescription(
        python=platform.python_version(),
        platform=platform.platform(),
        torchport=ours.version if ours is not None else None,
        torch=torch.version if torch is not None else None,
        libraries=libraries,
        targets=target_requirements.describe_targets(target_imports if answered else None),
        described_at=datetime.now(UTC),
        check_duration_s=round(duration, 3) if duration is not None else None,
    )


# --- what an upload imported ----------------------------------------------------------


def imported_libraries(
    before: Iterable[str],
    *,
    modules: Sequence[ModuleType] = (),
    upload_root: Path | None = None,
) -> dict[str, str]:
    """Distribution → version of the third-party libraries imported since `before`.

    `before` is `sys.modules`'s keys before the upload was imported. Libraries imported
    earlier (the zygote preloads some) are found too when one of `modules` (the upload's
    entry module) refers to them: a module, class or function of theirs among its
    globals. The standard library, torchport's own packages and the upload's own
    modules (under `upload_root`) are left out; torch is always in.
    """
    tops = {name.partition(".")[0] for name in set(sys.modules) - set(before)}
    for module in modules:
        for value in list(vars(module).values()):
            owner = value.__name__ if isinstance(value, ModuleType) else None
            if owner is None:
                owner = getattr(value, "__module__", None)
            if isinstance(owner, str):
                tops.add(owner.partition(".")[0])
    tops -= set(sys.stdlib_module_names) | OUR_PACKAGES | {"__main__", "builtins"}
    root = str(upload_root.resolve()) + os.sep if upload_root is not None else None
    found: dict[str, str] = {}
    for top in sorted(tops):
        loaded = sys.modules.get(top)
        # Modules without a file (built into torch, made up at run time) belong to no
        # distribution: looking them up would only build the index for nothing.
        locations = _locations(loaded) if loaded is not None else []
        if not locations or (root is not None and any(p.startswith(root) for p in locations)):
            continue
        for dist in _distributions_of(top):
            name = _metadata_name(dist)
            if name and canonicalize_name(name) != "torchport":
                found[name] = dist.version
    torch = _distribution("torch")
    if torch is not None:
        found[_metadata_name(torch)] = torch.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def _locations(module: ModuleType) -> list[str]:
    """Where a module's code is: its file, or a (namespace) package's folders."""
    file = getattr(module, "__file__", None)
    if isinstance(file, str):
        return [os.path.realpath(file)]
    paths: Any = getattr(module, "__path__", None)
    # torch registers pseudo-modules whose __path__ is not a list of folders
    if isinstance(paths, list) or type(paths).__name__ == "_NamespacePath":
        return [os.path.realpath(p) for p in paths if isinstance(p, str)]
    return []


def _distribution(name: str) -> metadata.Distribution | None:
    try:
        return metadata.distribution(name)
    except metadata.PackageNotFoundError:
        return None


def _distributions_of(top: str) -> list[metadata.Distribution]:
    """The distributions providing the top-level module `top`.

    Most are named after their module (transformers, torch, numpy): that guess is
    checked against the distribution's files in a few `stat` calls. The rest (yaml →
    PyYAML, PIL → pillow) come from an index of every distribution's modules, built once
    per process (~0.4 s: it reads every RECORD file), and only when needed.
    """
    for guess in dict.fromkeys((top, top.replace("_", "-"))):
        dist = _distribution(guess)
        if dist is not None and _provides(dist, top):
            return [dist]
    return [dist for name in _module_index().get(top, ()) if (dist := _distribution(name))]


def _provides(dist: metadata.Distribution, top: str) -> bool:
    declared = dist.read_text("top_level.txt")
    if declared:
        return top in {line.strip() for line in declared.splitlines()}
    located = Path(str(dist.locate_file(top)))
    return located.is_dir() or located.with_suffix(".py").is_file()


@functools.cache
def _module_index() -> dict[str, list[str]]:
    return {top: list(names) for top, names in metadata.packages_distributions().items()}


# --- requires ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RequirementCheck:
    """One requirement of the options and what is installed."""

    requirement: str
    name: str
    installed: str | None
    met: bool

    def as_details(self) -> dict[str, Any]:
        """The form `environment_mismatch` details list it in."""
        return {
            "requirement": self.requirement,
            "name": self.name,
            "installed": self.installed,
            "met": self.met,
        }


def check_requirements(requires: Iterable[str]) -> list[RequirementCheck]:
    """Each pip-style requirement against the installed distributions' versions.

    A requirement whose environment marker does not apply here counts as met; extras
    (`pkg[extra]`) are not checked, only the distribution itself. Prereleases satisfy
    a specifier (`torch>=2.9` is met by `2.10.0a0`).
    """
    checks = []
    for text in requires:
        requirement = Requirement(text)
        dist = _distribution(requirement.name)
        installed = dist.version if dist is not None else None
        if requirement.marker is not None and not requirement.marker.evaluate():
            met = True
        else:
            met = installed is not None and requirement.specifier.contains(
                installed, prereleases=True
            )
        checks.append(RequirementCheck(text, requirement.name, installed, met))
    return checks
