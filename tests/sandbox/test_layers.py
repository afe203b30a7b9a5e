"""Every layer this machine supports is in force, checked by what a job can do.

These tests fail (never skip) when a layer the host supports is missing, so CI
notices a regression in the sandbox set-up rather than quietly running with less.
"""

from __future__ import annotations

import errno
import json
import os
import re
import time
from pathlib import Path

import pytest
from pydantic import ValidationError

from schemas import ExportOptions
from tests.sandbox.conftest import (
    SPARE_WAIT_S,
    Arena,
    fresh_runner,
    job_processes,
    run_benign,
    supported_layers,
    wait_for_first_slot,
)
from worker.sandbox import SandboxJob, SandboxUnavailable
from worker.sandbox.confinement import layers


def probe(arena_or_runner: object, model: Path, job_dir: Path) -> tuple[dict, list[str]]:
    runner = getattr(arena_or_runner, "runner", arena_or_runner)
    wait_for_first_slot(runner)  # an idle machine: the job runs as slot 0's uid
    result = runner.run(  # type: ignore[attr-defined]
        SandboxJob(model=model, inputs=None, weights=None, options=ExportOptions(), job_dir=job_dir)
    )
    assert result.error is not None
    text = result.error.message + str(result.error.details.get("original_message", ""))
    found = re.search(r"PROBE(\{.*?\})PROBE", text)
    assert found is not None, result.error
    assert result.report.sandbox is not None
    return json.loads(found.group(1)), result.report.sandbox.layers


def test_every_supported_layer_is_in_force(each_arena: Arena) -> None:
    arena = each_arena
    result, _, _ = arena.run(arena.model("benign"))
    assert result.report.status == "succeeded"
    assert result.report.sandbox is not None
    in_force = set(result.report.sandbox.layers)
    missing = supported_layers() - in_force
    assert missing == set(), f"supported here but not in force: {sorted(missing)}"
    assert set(arena.runner.expected_layers()) <= in_force


def test_layers_by_effect(each_arena: Arena) -> None:
    arena = each_arena
    seen, in_force = probe(arena, arena.model("probe"), arena.root / "probe-job")
    assert seen["socket"] == errno.EPERM  # seccomp
    if "landlock" in in_force:
        assert seen["outside_read"] == errno.EACCES
    if "uid" in in_force:
        assert seen["uid"] == 65534
    if "bwrap" in in_force:
        assert seen["etc_exists"] is False
        assert seen["net"] in (errno.ENOENT, errno.EACCES, ["lo"])
        # Its own pid namespace: the job's parent (the zygote) has a pid there that is
        # not the zygote's pid out here (bwrap is 1 there, the zygote its first child).
        assert seen["ppid"] != arena.runner.zygote_pid
        assert seen["ppid"] < 10
    assert seen["outside_read"] != arena.secret_file.read_text()[:20]


def test_without_bwrap_the_inner_layers_still_hold(arena: Arena) -> None:
    with fresh_runner(use_bwrap=False) as runner:
        seen, in_force = probe(runner, arena.model("probe"), arena.root / "probe-nobwrap")
        assert "bwrap" not in in_force
        assert {"seccomp", "no_new_privs", "rlimits"} <= set(in_force)
        assert seen["socket"] == errno.EPERM
        if layers.landlock.abi_version() > 0:
            assert seen["outside_read"] == errno.EACCES
        result = runner.run(
            SandboxJob(
                model=arena.model("network"),
                inputs=None,
                weights=None,
                options=ExportOptions(timeout_s=20),
                job_dir=arena.root / "network-nobwrap",
            )
        )
        assert result.error is not None
        assert result.error.code == "sandbox_violation"
        assert arena.listeners.received == []
    deadline = time.monotonic() + 2
    while job_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert job_processes() == []


@pytest.mark.parametrize("spare", [False, True], ids=["fresh", "spare"])
def test_a_job_that_cannot_be_locked_down_is_refused(arena: Arena, spare: bool) -> None:
    if os.geteuid() != 0:
        pytest.fail("this check drops from root; CI runs as root")
    marker = arena.marker_dir / "unconfined"
    model = arena.root / "refused.py"
    model.write_text(f"open({str(marker)!r}, 'w').close()\n")
    with fresh_runner(uid=0, gid=0, use_bwrap=False, spares=spare) as runner:
        assert runner.wait_for_spares(SPARE_WAIT_S) is spare
        result = runner.run(
            SandboxJob(
                model=model,
                inputs=None,
                weights=None,
                options=ExportOptions(),
                job_dir=arena.root / "r",
            )
        )
    assert result.error is not None
    assert result.error.code == "sandbox_violation"
    assert result.report.sandbox is not None
    assert result.report.sandbox.details["spare"] is spare
    assert not marker.exists()


def test_no_seccomp_means_no_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layers, "probe_seccomp", lambda: (False, "test: no seccomp"))
    runner = fresh_runner(use_bwrap=False)
    with pytest.raises(SandboxUnavailable):
        runner.start()
    runner.close()


def test_disabled_sandbox_is_recorded(arena: Arena, capsys: pytest.CaptureFixture[str]) -> None:
    with fresh_runner(enabled=False) as runner:
        capsys.readouterr()
        result = runner.run(
            SandboxJob(
                model=arena.model("benign"),
                inputs=None,
                weights=None,
                options=ExportOptions.model_validate({"verify": {"roundtrip": False}}),
                job_dir=arena.root / "disabled",
            )
        )
    assert result.report.status == "succeeded"
    assert result.report.sandbox is not None
    assert result.report.sandbox.layers == ["none"]


def test_zygote_is_restarted_after_it_dies(arena: Arena) -> None:
    with fresh_runner() as runner:
        first = runner.zygote_pid
        assert first is not None
        assert runner.wait_for_spares(SPARE_WAIT_S)
        spares = runner.zygote_children()
        assert len(spares) == 2
        os.kill(first, 9)
        deadline = time.monotonic() + 5
        stat = Path(f"/proc/{first}/stat")
        while stat.exists() and time.monotonic() < deadline:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break
            time.sleep(0.05)
        result = run_benign(runner, arena, "restart")
        assert result.report.status == "succeeded", result.error
        assert runner.restarts == 1
        assert runner.zygote_pid != first
        # The idle spares died with their zygote (PR_SET_PDEATHSIG; bwrap's pid namespace).
        assert [pid for pid in spares if os.path.exists(f"/proc/{pid}")] == []


def test_invalid_options_never_reach_the_sandbox(arena: Arena) -> None:
    # Options are validated where a job comes from (the API, the CLI): a SandboxJob takes
    # only ExportOptions, so an unvalidated dict cannot even be handed to the runner.
    with pytest.raises(TypeError):
        SandboxJob(
            model=arena.model("benign"),
            inputs=None,
            weights=None,
            options={"no_such_option": 1},  # type: ignore[arg-type]
            job_dir=arena.root / "invalid",
        )
    with pytest.raises(ValidationError) as refused:
        ExportOptions.model_validate({"no_such_option": 1})
    assert refused.value.errors()[0]["type"] == "extra_forbidden"
    assert not (arena.root / "invalid").exists()
