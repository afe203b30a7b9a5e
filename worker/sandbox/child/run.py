"""What runs inside a locked-down job child: the export itself, talking to the worker
only through the pipes it was given (progress lines out, requests to the zygote —
round trips and toolchain programs, requests.py — and their answers back).

File descriptors of a job child (set up by the zygote before lockdown):
0 /dev/null, 1 and 2 the job's output pipe, 3 progress (JSON lines to the worker),
4 requests (to the zygote), 5 answers (from the zygote).
A loader child has 3 (its one-line answer, to the zygote) and 4 (the payload's path,
from the zygote, once the job has written it).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from worker.sandbox import protocol
from worker.sandbox.child.requests import channel
from worker.sandbox.child.requests import install as brokered_subprocesses

PROGRESS_FD = 3
MAX_OPTIONS = 16 << 20
"""Read of the spec and options files the worker wrote (more than any the API accepts)."""

# Audit events of actions the sandbox forbids, and how to say so to a person.
_FORBIDDEN_EVENTS = {
    "socket.__new__": "open a network or local socket",
    "socket.connect": "connect a socket",
    "socket.bind": "bind a socket",
    "os.exec": "run another program",
    "os.posix_spawn": "start a process",
    "os.spawn": "start a process",
    "os.fork": "fork a process",
    "os.forkpty": "fork a process",
    "os.system": "run a shell command",
    "subprocess.Popen": "start a process",
    "os.kill": "send a signal",
    "os.killpg": "send a signal",
}


class _Attempts:
    """Forbidden actions the uploaded code tried (seccomp or Landlock stopped them).

    The audit hook is the C method `dict.get` of a table whose keys are tripwires, one per
    forbidden event: CPython calls the hook on every audit event, and torch raises one
    per `id()` call (~85,000 in a transformer block's export), so a hook written in
    Python cost that export ~45 ms, this one ~11 ms (bench/audit_hook.py). A lookup
    runs Python only when the event's hash matches a tripwire's: the tripwire's
    `__eq__` then looks for the upload on the stack. A signal the job sends to itself
    is counted too (the hook does not see its args)."""

    def __init__(self, user_roots: list[Path]) -> None:
        self.seen: dict[str, str] = {}
        """Attempts the upload's own code made (directly or through the standard library)."""
        self.by_libraries: dict[str, str] = {}
        """Attempts an installed library made on the upload's behalf (urllib3 probing for
        IPv6 at import): the library survives the refusal or fails with its own error."""
        self.libraries: set[str] = set()
        """The installed packages that made them (the innermost on the stack: `urllib3`)."""
        self.stages: set[str | None] = set()
        """The stages in which the upload's own attempts were made."""
        self.stage: str | None = None
        self._roots = tuple(str(root) + os.sep for root in user_roots)
        tripwires: dict[object, None] = {_Tripwire(e, self): None for e in _FORBIDDEN_EVENTS}
        self.hook: Callable[[str, tuple[Any, ...]], object] = tripwires.get

    def saw(self, event: str) -> None:
        found, library = self._origin()
        if found and library is None:
            self.seen.setdefault(event, _FORBIDDEN_EVENTS[event])
            self.stages.add(self.stage)
        elif found and library is not None:
            self.by_libraries.setdefault(event, _FORBIDDEN_EVENTS[event])
            self.libraries.add(library)

    def _origin(self) -> tuple[bool, str | None]:
        """Whether the upload is on the stack (not: torch or the engine made the call),
        and the installed package between the event and the upload's innermost frame
        that made it (None: the uploaded code did, through the standard library at most)."""
        frame = sys._getframe(3)
        library: str | None = None
        while frame is not None:
            name = frame.f_code.co_filename
            if name.startswith(self._roots):
                return True, library
            if library is None:
                library = _installed_package(name)
            frame = frame.f_back  # type: ignore[assignment]
        return False, None

    def all(self) -> dict[str, str]:
        return {**self.by_libraries, **self.seen}


def _installed_package(filename: str) -> str | None:
    """`urllib3` for `…/site-packages/urllib3/util/connection.py`; None outside them."""
    for folder in ("site-packages", "dist-packages"):
        _, found, rest = filename.partition(f"{os.sep}{folder}{os.sep}")
        if found:
            return rest.split(os.sep, 1)[0].removesuffix(".py") or None
    return None


def denied_warning(attempts: _Attempts) -> Any:
    """The `sandbox_denied` warning of the attempts a job survived (or that are not its
    outcome). Where only installed libraries tried, it says so and sets `by_library`:
    nothing of the uploaded code's own was refused."""
    from schemas import ReportWarning

    tried = attempts.all()
    own = ", ".join(sorted(set(attempts.seen.values())))
    theirs = ", ".join(sorted(set(attempts.by_libraries.values())))
    names = ", ".join(sorted(attempts.libraries))
    if not attempts.seen:
        message = (
            f"A library the upload uses ({names}) tried to {theirs}; the sandbox refused it "
            "and the library went on without it. The uploaded code itself tried nothing "
            "the sandbox forbids."
        )
    else:
        message = f"The uploaded code tried actions the sandbox forbids: {own}"
        if attempts.by_libraries:
            message += f"; a library it uses ({names}) tried to {theirs}"
    return ReportWarning(
        code="sandbox_denied",
        message=message,
        details={
            "attempted": sorted(tried),
            "by_libraries": sorted(attempts.by_libraries),
            "by_library": not attempts.seen,
            "libraries": sorted(attempts.libraries),
        },
    )


class _Tripwire:
    """A key equal to no event name that tells `attempts` when its own is looked up."""

    __slots__ = ("attempts", "event", "hash")

    def __init__(self, event: str, attempts: _Attempts) -> None:
        self.event, self.attempts, self.hash = event, attempts, hash(event)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        if other == self.event:
            self.attempts.saw(self.event)
        return False


def write_progress(line: dict[str, Any]) -> None:
    """One JSON line to the worker; dropped when the pipe is gone."""
    data = (json.dumps(line) + "\n").encode()
    with contextlib.suppress(OSError):
        os.write(PROGRESS_FD, data)


def read_line(fd: int, limit: int) -> bytes:
    """Read from `fd` until a newline, end of file or `limit` bytes, whichever is first."""
    data = b""
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data += chunk
    return data


class RoundtripRequests:
    """Round trips through the zygote: `prefetch` asks for a loader as soon as the
    program is saved (it loads the program while this process writes the documents and
    the payload); calling the object sends the payload's path and waits for the answer.

    Request lines on fd 4: `{"pt2", "threads"}` starts a loader, `{"payload"}` hands it
    the payload (both in one line does both), `{"drop"}` stops the loader (the program
    it was loading changed). One JSON line comes back on fd 5 for each round trip and
    each drop (requests.Channel sorts them from toolchain answers).
    """

    def __init__(self) -> None:
        self.prefetched: Path | None = None

    def prefetch(self, pt2: Path) -> None:
        import torch

        # The loader runs the program with this process's thread count, as the payload's
        # expected outputs were computed (a reduction split differently may round
        # differently).
        channel().send({"pt2": str(pt2), "threads": torch.get_num_threads()})
        self.prefetched = pt2

    def drop(self) -> None:
        """Stop the loader of the program prefetched; whatever it answered before is
        read and discarded, up to the zygote's `{"dropped": true}`."""
        if self.prefetched is None:
            return
        self.prefetched = None
        channel().send({"drop": True})
        while (answer := channel().receive("roundtrip")) is not None:
            if answer.get("dropped") is True:
                return

    def __call__(self, pt2: Path, payload: Path) -> dict[str, Any]:
        if self.prefetched != pt2:
            self.prefetch(pt2)
        self.prefetched = None
        channel().send({"payload": str(payload)})
        parsed = channel().receive("roundtrip")
        if parsed is None:
            return {"status": "failed", "reason": "the sandboxed loader gave no answer"}
        return parsed


def run_export_job(root: str) -> int:
    """Run one export in this (locked-down) process, as the spec in the job's staging
    `root` says (`protocol.JOB_SPEC`); returns the exit code."""
    import torch

    from engine.load.model import Upload
    from engine.pipeline import export as pipeline
    from schemas import ExportOptions, RoundtripCheck

    try:
        with open(Path(root) / protocol.JOB_SPEC, "rb") as handle:
            spec = json.loads(handle.read(MAX_OPTIONS))
        with open(spec["options_file"], "rb") as handle:
            options = ExportOptions.model_validate_json(handle.read(MAX_OPTIONS))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        write_progress({"refused": "invalid_request", "message": str(exc)[:2000]})
        return 3

    # The zygote runs single-threaded so that it can fork; the job gets the machine's
    # CPUs back (its intra-op pool starts fresh, in this process).
    torch.set_num_threads(int(spec.get("threads") or len(os.sched_getaffinity(0))))

    out_dir, work_dir = Path(spec["out_dir"]), Path(spec["work_dir"])
    attempts = _Attempts([Path(spec["model"]).parent, work_dir])
    sys.addaudithook(attempts.hook)
    # Programs (a target's compiler, flatc) run in the zygote's toolchain children, never
    # here: this process may not exec (toolchain.py).
    brokered_subprocesses()

    requests = RoundtripRequests()

    def roundtrip(pt2: Path, payload: Path) -> RoundtripCheck:
        answer = requests(pt2, payload)
        answer["loader"] = "sandbox"
        try:
            return RoundtripCheck.model_validate(answer)
        except ValueError as exc:
            return RoundtripCheck(status="failed", loader="sandbox", reason=f"bad answer: {exc}")

    upload = Upload(
        model=Path(spec["model"]),
        inputs=Path(spec["inputs"]) if spec.get("inputs") else None,
        weights=Path(spec["weights"]) if spec.get("weights") else None,
        calibration=Path(spec["calibration"]) if spec.get("calibration") else None,
    )
    request = pipeline.ExportRequest(
        upload=upload,
        options=options,
        out_dir=out_dir,
        work_dir=work_dir,
        digest_artifacts=False,  # the worker hashes what it accepts (results.finish)
        # The worker's own limit; stopped by it, the job is what its provisional report
        # says (results.finish delivers it).
        time_limit_s=float(spec["timeout_s"]) if spec.get("timeout_s") else None,
        provisional_report=True,
    )

    def progress(p: Any) -> None:
        if p.stage != attempts.stage:
            # This process runs one export and exits. What is alive when a stage starts
            # lives on (the model, the programs) or is the last stage's garbage; the young
            # garbage is collected, the rest frozen, so the collector's full passes walk
            # only what the new stage makes (the zygote froze its own heap likewise). A
            # 250M-parameter Llama's full passes: 2.9 s → 1.1 s across its stages, peak
            # memory unchanged (docs/models.md). Old cycles of a finished stage stay.
            gc.collect(1)
            gc.freeze()
        attempts.stage = p.stage  # where an attempt happens decides what it means
        write_progress({"progress": p.model_dump(mode="json")})

    try:
        pipeline.run_export(
            request,
            progress=progress,
            roundtrip_runner=roundtrip,
            roundtrip_prefetch=requests.prefetch,
            roundtrip_drop=requests.drop,
            finish_report=lambda report: _reclassify(report, attempts),
        )
    except MemoryError:
        write_progress({"refused": "out_of_memory", "message": "MemoryError"})
        return 4
    # The worker reads the outputs back (into copies) and stops this process: what was
    # printed goes down the output pipe first, so the job's log has it. The interpreter's
    # own streams, not whatever the upload put in `sys.stdout`: its code runs no more.
    for stream in (sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):
            if stream is not None:
                stream.flush()
    write_progress({"done": True})
    return 0


def _reclassify(report: Any, attempts: _Attempts) -> None:
    """Name the real cause when a failure came from a forbidden action the job tried
    (before the report is written: `pipeline.run_export(finish_report=...)`).

    Limits (memory, the largest file) are named by the pipeline, from the exception itself
    (`engine.diagnostics.classification.limit_reached`), never here from message text.
    """
    from schemas.outcomes import error_body

    error = report.error
    tried = attempts.all()
    # The upload's own attempt is the outcome when the job failed in the stage that made
    # it. One the job survived, or one a library made, is a warning: the outcome is what
    # happened next (a verification failure stays one).
    caused = (
        error is not None
        and bool(attempts.seen)
        and (error.stage is None or error.stage in attempts.stages)
    )
    if tried and not caused:
        report.warnings.append(denied_warning(attempts))
    if caused:
        assert error is not None
        error.details = {
            "original_code": error.code,
            "original_message": error.message,
            "attempted": sorted(tried),
        }
        verdict = error_body(
            "sandbox_violation",
            "The uploaded code tried to "
            + ", ".join(sorted(set(tried.values())))
            + "; the sandbox forbids it.",
        )
        error.code, error.message, error.hint = verdict.code, verdict.message, verdict.hint


def check_roundtrip(pt2: str, payload: str) -> dict[str, Any]:
    """In the second child: load and run the saved program (imports only torch)."""
    from engine.serialize import roundtrip

    return roundtrip.check_saved(pt2, payload)
