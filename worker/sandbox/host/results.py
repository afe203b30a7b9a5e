"""What a job's run becomes: its error (from the supervisor's verdict, the job's exit
and what it said on its progress pipe), the layers that were in force, and the final
report and artifacts in `job_dir/out`. Also the unsandboxed path of a runner whose
sandbox is disabled.
"""

from __future__ import annotations

import math
import os
import platform
import shutil
import signal
import tempfile
import time
from functools import partial
from importlib import metadata
from pathlib import Path
from typing import Any

from engine.serialize.artifacts import CRASH_REPORT, PROVISIONAL_REPORT, REPORT
from schemas import (
    ArtifactInfo,
    Environment,
    ErrorBody,
    ExportOptions,
    ReportDocument,
    ReportWarning,
    SandboxReport,
)
from schemas.outcomes import canceled, error_body
from worker.sandbox.host import quota
from worker.sandbox.host.outputs import (
    Accepted,
    Untrusted,
    copy_regular,
    take_outputs,
    take_regular,
)
from worker.sandbox.host.pipes import ProgressCallback
from worker.sandbox.host.supervisor import Watch
from worker.sandbox.settings import SandboxJob, SandboxResult, SandboxSettings

__all__ = ["describe_disk", "finish", "list_layers", "map_error", "run_unconfined"]


def finish(
    job: SandboxJob,
    produced: Path | None,
    error: ErrorBody | None,
    tail: str,
    started: float,
    details: dict[str, Any],
    settings: SandboxSettings,
    *,
    bwrap: bool,
    watch: Watch | None = None,
    timed_out: bool = False,
) -> SandboxResult:
    """Write the job's final report (this is its only writer) and put its accepted
    artifacts into `job_dir/out`: the copies taken while it exited (`watch.accepted`),
    else those in `produced`, checked and copied now. Every artifact there is then the
    worker's own copy, hashed once as it was copied (`report.artifacts`); a failed
    report when there is an error or no valid report. A job stopped by its time limit
    (`timed_out`) that wrote a provisional report (`PROVISIONAL_REPORT`: it had saved its
    program), or one whose process crashed (`error`: an `internal_error` of `reason`
    `crashed`) after writing `CRASH_REPORT`, is what that report says, with what it lists
    and the crash's signal; else it failed (`error`)."""
    out_dir = job.job_dir / "out"
    out_dir.mkdir(parents=True, exist_ok=True)
    report: ReportDocument | None = None
    found: dict[str, Path] = {}
    infos: dict[str, ArtifactInfo] = {}
    accepted = watch.accepted if watch is not None else None
    crash = _crash(error)
    memory = error is not None and error.code == "out_of_memory"
    provisional = None
    if timed_out or crash is not None or memory:
        which = PROVISIONAL_REPORT if timed_out else CRASH_REPORT
        provisional = _provisional(produced, settings, started, which)
        if provisional is not None and crash is not None:
            _signal_into(provisional.report, crash)
        if provisional is not None and memory and error is not None:
            _memory_into(provisional.report, error.details.get("memory_mb"))
    if provisional is not None:
        report, found, error = provisional.report, provisional.files, None
    elif accepted is not None and error is None:
        report, found, infos = accepted.report, accepted.files, accepted.infos
    elif produced is not None and error is None:
        try:
            taken = take_outputs(produced, settings)
            assert taken is not None  # only a copy is ever declined
            report, found = taken.report, taken.files
        except Untrusted as exc:
            error = _rejected(exc)
    if error is not None or report is None:
        error = error or error_body("internal_error", "The job ended without a report.")
        report = _failed_report(error, time.perf_counter() - started)
        found = {}
    artifacts: dict[str, Path] = {}
    # Taken where the job wrote them: moved out of its reach when none of its processes
    # is left (the tree's cgroup or sessions say so), else copied; hashed once either way.
    alone = watch is None or not watch.tree.members()
    take = take_regular if alone else partial(copy_regular, magic=None)
    try:
        for name, path in found.items():
            target = out_dir / name
            if name in infos:  # the worker's copy, hashed as it was copied
                os.replace(path, target)
            else:
                copied = take(path, target, settings.max_program_bytes)
                if copied is None:
                    raise Untrusted(f"{name} disappeared")
                infos[name] = copied
            artifacts[name] = target
    except (Untrusted, OSError) as exc:
        error = _rejected(exc)
        report = _failed_report(error, time.perf_counter() - started)
        for path in artifacts.values():
            path.unlink(missing_ok=True)
        artifacts, infos = {}, {}
    if accepted is not None and accepted.directory is not None:
        shutil.rmtree(accepted.directory, ignore_errors=True)
    report.sandbox = SandboxReport(
        layers=list_layers(watch, settings, bwrap=bwrap), details=details
    )
    report.artifacts = [infos[name] for name in artifacts]
    report_path = out_dir / REPORT
    report_path.write_text(report.model_dump_json(indent=2))
    artifacts[REPORT] = report_path
    return SandboxResult(report=report, artifacts=artifacts, error=report.error, stdout_tail=tail)


def _crash(error: ErrorBody | None) -> str | None:
    """The signal a job's process crashed of (`map_error`'s crash), or None."""
    details = error.details if error is not None else {}
    if error is None or error.code != "internal_error" or details.get("reason") != "crashed":
        return None
    return str(details.get("signal"))


def _signal_into(report: ReportDocument, signal_name: str) -> None:
    """The crash's signal in what a crash report says crashed: the target in progress
    (its error and its `target_failed` warning), or the warning `crashed`."""
    bodies = [t.error for t in report.targets.values() if t.error is not None]
    if report.error is not None:
        bodies.append(report.error)
    for body in bodies:
        if body.details.get("reason") == "crashed":
            body.details["signal"] = signal_name
    for warning in report.warnings:
        if warning.code == "crashed" or (
            warning.code == "target_failed" and warning.details.get("reason") == "crashed"
        ):
            warning.details["signal"] = signal_name


def _memory_into(report: ReportDocument, memory_mb: Any) -> None:
    """A crash report made the report of a job stopped at its memory limit: the target in
    progress failed `out_of_memory` (or, between targets, warning `out_of_memory`)."""
    hint = (
        "Raise `memory_mb` (unset, it is sized from the uploads or the default), or leave "
        "this target out of `targets`. program.pt2 and the targets finished before it are "
        "kept."
    )
    for name, target in report.targets.items():
        body = target.error
        if body is not None and body.details.get("reason") == "crashed":
            body.message = (
                f"{name}: the job reached its memory limit of {memory_mb} MB while this "
                "target was converted, loaded or verified, and was stopped"
            )
            body.hint = hint
            body.details = {"target": name, "reason": "out_of_memory", "memory_mb": memory_mb}
            if report.error is not None and report.error.details.get("reason") == "crashed":
                report.error = body  # `targets_required`
            for warning in report.warnings:
                if warning.code == "target_failed" and warning.details.get("target") == name:
                    warning.message, warning.details = body.message, dict(body.details)
    for index, warning in enumerate(report.warnings):
        if warning.code == "crashed":
            stage = warning.details.get("stage")
            report.warnings[index] = ReportWarning(
                code="out_of_memory",
                message=f"The job reached its memory limit of {memory_mb} MB in stage "
                f"{stage} and was stopped; what it finished before is kept.",
                details={"stage": stage, "memory_mb": memory_mb},
            )
    if report.stages and report.stages[-1].status == "failed":
        report.stages[-1].message = "stopped at the job's memory limit"


def _provisional(
    produced: Path | None, settings: SandboxSettings, started: float, which: str
) -> Accepted | None:
    """The outputs a stopped job listed in its provisional report `which` (the same
    checks as `report.json`'s), its stopped stage given the time since it was written;
    None when it wrote none or one the checks refuse (the job then failed as it stopped)."""
    if produced is None:
        return None
    try:
        taken = take_outputs(produced, settings, report=which)
    except Untrusted:
        return None
    if taken is None:
        return None
    report = taken.report
    elapsed = time.perf_counter() - started
    written = report.duration_s or 0.0
    if report.stages and report.stages[-1].status == "failed":
        report.stages[-1].duration_s += max(0.0, elapsed - written)
    report.duration_s = max(written, elapsed)
    return taken


def list_layers(watch: Watch | None, settings: SandboxSettings, *, bwrap: bool) -> list[str]:
    """The layers the job child said were in force (report.sandbox.layers)."""
    if not settings.enabled:
        return ["none"]
    in_force = (watch.lockdown if watch is not None else None) or {}
    if not in_force:
        return []
    layers_in_force = ["zygote", "rlimits"]
    if in_force.get("no_new_privs"):
        layers_in_force.append("no_new_privs")
    if settings.job_ids() is not None and in_force.get("uid") not in (None, 0):
        layers_in_force.append("uid")
    if in_force.get("landlock_abi"):
        layers_in_force.append("landlock")
    if in_force.get("seccomp"):
        layers_in_force.append("seccomp")
    if bwrap:
        layers_in_force.append("bwrap")
    return layers_in_force


def map_error(
    verdict: str | None,
    exit_info: dict[str, Any],
    watch: Watch,
    timeout: float,
    memory_mb: int,
    settings: SandboxSettings,
) -> ErrorBody | None:
    """The job's error, if any: the supervisor's verdict first, then a refusal the job
    child wrote, then how it exited, then a lockdown it never reported or bad lines."""
    if verdict == "timeout":
        return error_body("timeout", timeout_s=timeout, details={"timeout_s": timeout})
    if verdict == "out_of_memory":
        return _out_of_memory(memory_mb)
    if verdict == "disk_quota_exceeded":
        return error_body(
            "disk_quota_exceeded",
            disk_mb=settings.disk_mb,
            max_inodes=settings.max_inodes,
            details=describe_disk(watch.disk, settings),
        )
    if verdict == "canceled":
        return canceled()
    if verdict == "zygote_died":
        return error_body(
            "internal_error", "The sandbox process died while the job ran; it has been restarted."
        )
    if watch.refused is not None:
        code, message = watch.refused
        if code == "out_of_memory":
            return _out_of_memory(memory_mb)
        if code == "sandbox_violation":
            message = f"The sandbox could not be set up, so the job was not run: {message}"
        return ErrorBody.model_validate({"code": code, "message": message})
    if exit_info.get("killed_for"):
        return ErrorBody(
            code="sandbox_violation",
            message=f"The sandbox stopped the job: {exit_info['killed_for']}.",
            hint="Uploaded code may not write to file descriptors it did not open.",
            details={"reason": exit_info["killed_for"]},
        )
    signum = exit_info.get("signal")
    if signum == signal.SIGXCPU:
        return error_body("timeout", "The job used up its CPU time limit and was stopped.")
    if signum == signal.SIGSYS:
        return error_body(
            "sandbox_violation", "The uploaded code made a system call the sandbox forbids."
        )
    if signum == signal.SIGKILL:
        return _out_of_memory(memory_mb)  # nobody else kills a job: the kernel's OOM killer
    if signum is not None:
        return ErrorBody(
            code="internal_error",
            message=f"The job's process crashed ({signal.Signals(signum).name}).",
            hint="A crash in native code; if your model uses none, please report it.",
            details={"reason": "crashed", "signal": signal.Signals(signum).name},
        )
    if watch.lockdown is None:
        return ErrorBody(
            code="sandbox_violation",
            message="The sandbox could not be set up, so the job was not run.",
            details={"exit": exit_info},
        )
    if watch.bad_lines:
        return ErrorBody(
            code="sandbox_violation",
            message="The uploaded code wrote to the sandbox's own progress pipe "
            f"({watch.bad_lines} malformed line(s): too long, too deep or not JSON).",
            hint="Uploaded code may not write to file descriptors it did not open.",
            details={"bad_lines": watch.bad_lines},
        )
    return None


def describe_memory(
    limit_bytes: int, watch: Watch, group: Path | None, memory_cgroup: bool
) -> dict[str, Any]:
    """The job's whole tree (tree.py): its limit, the most it was seen to hold
    together, and how the worker found its processes."""
    return {
        "limit_mb": limit_bytes >> 20,
        "peak_mb": round(watch.tree_peak / (1 << 20), 1),
        "tree": "cgroup" if group is not None else "sessions",
        "memory_cgroup": memory_cgroup,
    }


def describe_disk(use: quota.DiskUse | None, settings: SandboxSettings) -> dict[str, Any]:
    """The job's disk limits and the most it was measured to hold."""
    details: dict[str, Any] = {"disk_mb": settings.disk_mb, "max_inodes": settings.max_inodes}
    if use is not None:
        details.update(
            # Rounded up: a use over the quota never reads as the quota itself.
            used_mb=math.ceil(use.bytes * 10 / (1 << 20)) / 10,
            inodes=use.inodes,
            unlinked_mb=round(use.unlinked_bytes / (1 << 20), 1),
            open_files_checked=use.open_files_checked,
        )
    return details


def run_unconfined(
    job: SandboxJob,
    options: ExportOptions,
    on_progress: ProgressCallback | None,
) -> SandboxResult:
    """Run the export in this process (the sandbox is disabled); the report says so."""
    from engine.load.model import Upload
    from engine.pipeline import export as pipeline

    work = Path(tempfile.mkdtemp(prefix="torchport-job-"))
    try:
        files: dict[str, Path] = {}
        for role, source in job.uploads().items():
            files[role] = work / "in" / role / source.name
            files[role].parent.mkdir(parents=True)
            source.copy_to(files[role])
        result = pipeline.run_export(
            pipeline.ExportRequest(
                upload=Upload(
                    model=files["model"],
                    inputs=files.get("inputs"),
                    weights=files.get("weights"),
                    calibration=files.get("calibration"),
                ),
                options=options,
                out_dir=job.job_dir / "out",
                work_dir=work / "work",
            ),
            progress=on_progress,
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report = result.report
    report.sandbox = SandboxReport(layers=["none"], details={"warning": "sandbox disabled"})
    report_path = job.job_dir / "out" / REPORT
    report_path.write_text(report.model_dump_json(indent=2))
    artifacts = {**result.artifacts, REPORT: report_path}
    return SandboxResult(report=report, artifacts=artifacts, error=report.error)


def _rejected(exc: Untrusted | OSError) -> ErrorBody:
    """The error of a job whose outputs were refused; `details` name the file and the
    limit it broke, when it broke one."""
    details = exc.details if isinstance(exc, Untrusted) else None
    return error_body("internal_error", f"The job's results were rejected: {exc}", details=details)


def _out_of_memory(memory_mb: int) -> ErrorBody:
    return error_body("out_of_memory", memory_mb=memory_mb, details={"memory_mb": memory_mb})


def _failed_report(error: ErrorBody, duration: float) -> ReportDocument:
    return ReportDocument(
        status="failed", error=error, environment=_environment(), duration_s=duration
    )


def _environment() -> Environment:
    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return Environment(
        torchport=version("torchport") or "unknown",
        torch=version("torch"),
        python=platform.python_version(),
        platform=platform.platform(),
    )
