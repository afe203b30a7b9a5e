"""The zygote's warm model libraries (worker/sandbox/zygote/warm_libraries.py): those that import
cleanly are imported before it forks, one that fails, starts a thread or hangs is skipped,
and every job still sees each library as it was after its import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from worker.sandbox import SandboxResult, SandboxSettings
from worker.sandbox.zygote.warm_libraries import default_libraries, wanted_libraries

from .conftest import MODELS, Arena

LIBRARIES = {
    "good_lib": "VALUE = 1\n",
    "failing_lib": "raise ImportError('no such backend')\n",
    "threading_lib": (
        "import threading\n"
        "STOP = threading.Event()\n"
        "threading.Thread(target=STOP.wait, name='lib-monitor', daemon=True).start()\n"
    ),
    "uses_threading_lib": "import threading_lib\n",
    "slow_lib": "import time\ntime.sleep(30)\n",
    "late_lib": "VALUE = 2\n",
}

DRIVER = """
import json, sys
from worker.sandbox.zygote import threads, warm_libraries
before = threads.task_ids()
warmed = warm_libraries.warm_libraries(json.loads(sys.argv[1]), timeout_s=float(sys.argv[2]))
print(json.dumps({
    **warmed.to_json(),
    "threads": [str(t) for t in threads.started_since(before)],
    "modules": sorted(m for m in sys.modules if m.endswith("_lib")),
}))
"""


def _warm(tmp_path: Path, names: list[str], timeout_s: float = 60) -> dict[str, object]:
    for name, source in LIBRARIES.items():
        (tmp_path / f"{name}.py").write_text(source)
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(names), str(timeout_s)],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{tmp_path}"},
        timeout=120,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    result["log"] = done.stderr
    return result


def test_a_library_that_fails_or_starts_a_thread_is_skipped_not_fatal(tmp_path: Path) -> None:
    names = ["good_lib", "failing_lib", "threading_lib", "uses_threading_lib", "late_lib"]
    result = _warm(tmp_path, names)
    assert result["imported"] == ["good_lib", "late_lib"]
    skipped = result["skipped"]
    assert isinstance(skipped, dict)
    assert sorted(skipped) == ["failing_lib", "threading_lib", "uses_threading_lib"]
    assert skipped["failing_lib"].startswith("ImportError")
    assert "'lib-monitor'" in skipped["threading_lib"]
    assert "'lib-monitor'" in skipped["uses_threading_lib"]  # judged as the zygote would
    # the probes ran in forks: no thread and none of the skipped modules here
    assert result["threads"] == []
    assert result["modules"] == ["good_lib", "late_lib"]
    assert "not warming threading_lib" in str(result["log"])


def test_a_library_whose_import_does_not_finish_is_skipped(tmp_path: Path) -> None:
    result = _warm(tmp_path, ["good_lib", "slow_lib", "late_lib"], timeout_s=3)
    assert result["imported"] == ["good_lib"]
    assert result["skipped"] == {
        "slow_lib": "its import did not finish in time",
        "late_lib": "not probed: time ran out",
    }
    assert result["modules"] == ["good_lib"]


def test_the_setting_takes_module_names_only() -> None:
    assert SandboxSettings().warm_libraries is None
    assert SandboxSettings(warm_libraries=["transformers.models.bert"]).warm_libraries == [
        "transformers.models.bert"
    ]
    for bad in ("os; import shutil", "../evil", "", "a..b"):
        with pytest.raises(ValidationError):
            SandboxSettings(warm_libraries=[bad])


def test_no_library_is_warmed_on_a_gpu_worker_or_without_the_warm_up() -> None:
    """A GPU worker's zygote hides CUDA while it warms up: a library could cache that."""
    installed = default_libraries()
    assert installed[:3] == ["transformers", "diffusers", "peft"]
    assert wanted_libraries({"warm_up": True}) == installed
    assert wanted_libraries({"warm_up": True, "warm_libraries": ["timm"]}) == ["timm"]
    assert wanted_libraries({"warm_up": True, "warm_libraries": []}) == []
    assert wanted_libraries({"warm_up": True, "gpu": {"devices": []}}) == []
    assert wanted_libraries({"warm_up": "during_first_job"}) == []
    assert wanted_libraries({"warm_up": False}) == []


def _seen(result: SandboxResult) -> dict[str, object]:
    assert result.report.status == "succeeded", result.error
    lines = [line for line in result.stdout_tail.splitlines() if line.startswith("SEEN ")]
    assert len(lines) == 1, result.stdout_tail
    seen: dict[str, object] = json.loads(lines[0].removeprefix("SEEN "))
    return seen


def test_jobs_import_warm_libraries_and_never_see_each_others_changes(
    each_arena: Arena, tmp_path: Path
) -> None:
    """One job patches a function of transformers; the next job, forked from the same
    zygote (fresh or from a spare), sees the library as it was imported."""
    installed = default_libraries()
    assert "transformers" in installed  # the `models` extra the tests run with
    looker = tmp_path / "look.py"
    source = (MODELS / "warm_library_patch.py").read_text()
    looker.write_text(source.replace("PATCH = True", "PATCH = False"))
    os.chmod(tmp_path, 0o755)

    first, _, _ = each_arena.run(MODELS / "warm_library_patch.py")
    patcher = _seen(first)
    assert patcher == {
        "warm_before": True,
        "patched_before": None,
        "function_before": "get_state_dict_dtype",
        "function_after": "patched_state_dict_dtype",
    }
    assert first.report.sandbox is not None
    assert first.report.sandbox.details["warm_libraries"] == installed

    second, _, _ = each_arena.run(looker)
    assert _seen(second) == {
        "warm_before": True,
        "patched_before": None,
        "function_before": "get_state_dict_dtype",
        "function_after": "get_state_dict_dtype",
    }
