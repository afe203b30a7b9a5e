"""What runs inside a locked-down job child: the export itself, talking to the worker
only through the pipes it was given (progress lines out, round-trip requests to the
zygote and their answers back).

File descriptors of a job child (set up by the zygote before lockdown):
0 /dev/null, 1 and 2 the job's output pipe, 3 progress (JSON lines to the worker),
4 round-trip requests (to the zygote), 5 round-trip answers (from the zygote).
A loader child has 3 (its one-line answer, to the zygote) and 4 (the payload's path,
from the zygote, once the job has written it).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

PROGRESS_FD = 3
ROUNDTRIP_REQUEST_FD = 4
ROUNDTRIP_ANSWER_FD = 5

MAX_ANSWER = 1 << 20

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
        self._roots = tuple(str(root) + os.sep for root in user_roots)
        tripwires: dict[object, None] = {_Tripwire(e, self): None for e in _FORBIDDEN_EVENTS}
        self.hook: Callable[[str, tuple[Any, ...]], object] = tripwires.get

    def saw(self, event: str) -> None:
        if self._from_upload():
            self.seen.setdefault(event, _FORBIDDEN_EVENTS[event])

    def _from_upload(self) -> bool:
        """Whether the uploaded code is on the stack (not torch or the engine)."""
        frame = sys._getframe(1)
        while frame is not None:
            if frame.f_code.co_filename.startswith(self._roots):
                return True
            frame = frame.f_back  # type: ignore[assignment]
        return False


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
    the payload (both in one line does both). One JSON line comes back on fd 5.
    """

    def __init__(self) -> None:
        self.prefetched: Path | None = None

    def prefetch(self, pt2: Path) -> None:
        import torch

        # The loader runs the program with this process's thread count, as the payload's
        # expected outputs were computed (a reduction split differently may round
        # differently).
        self._send({"pt2": str(pt2), "threads": torch.get_num_threads()})
        self.prefetched = pt2

    def __call__(self, pt2: Path, payload: Path) -> dict[str, Any]:
        if self.prefetched != pt2:
            self.prefetch(pt2)
        self.prefetched = None
        self._send({"payload": str(payload)})
        answer = read_line(ROUNDTRIP_ANSWER_FD, MAX_ANSWER)
        try:
            parsed = json.loads(answer)
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            return {"status": "failed", "reason": "the sandboxed loader gave no answer"}
        return parsed

    @staticmethod
    def _send(request: dict[str, Any]) -> None:
        os.write(ROUNDTRIP_REQUEST_FD, (json.dumps(request) + "\n").encode())


def run_export_job(spec: dict[str, Any]) -> int:
    """Run one export in this (locked-down) process; returns the exit code."""
    import torch

    from engine import pipeline
    from engine.artifacts import REPORT
    from engine.model import Upload
    from schemas import ExportOptions, RoundtripCheck

    # The zygote runs single-threaded so that it can fork; the job gets the machine's
    # CPUs back (its intra-op pool starts fresh, in this process).
    torch.set_num_threads(int(spec.get("threads") or len(os.sched_getaffinity(0))))

    out_dir, work_dir = Path(spec["out_dir"]), Path(spec["work_dir"])
    attempts = _Attempts([Path(spec["model"]).parent, work_dir])
    sys.addaudithook(attempts.hook)

    requests = RoundtripRequests()

    def roundtrip(pt2: Path, payload: Path) -> RoundtripCheck:
        answer = requests(pt2, payload)
        answer["loader"] = "sandbox"
        try:
            return RoundtripCheck.model_validate(answer)
        except ValueError as exc:
            return RoundtripCheck(status="failed", loader="sandbox", reason=f"bad answer: {exc}")

    try:
        options = ExportOptions.model_validate(spec["options"])
    except ValueError as exc:
        write_progress({"refused": "invalid_request", "message": str(exc)[:2000]})
        return 3
    upload = Upload(
        model=Path(spec["model"]),
        inputs=Path(spec["inputs"]) if spec.get("inputs") else None,
        weights=Path(spec["weights"]) if spec.get("weights") else None,
    )
    request = pipeline.ExportRequest(
        upload=upload,
        options=options,
        out_dir=out_dir,
        work_dir=work_dir,
        digest_artifacts=False,  # the worker hashes what it accepts (runner._finish)
    )
    try:
        result = pipeline.run_export(
            request,
            progress=lambda p: write_progress({"progress": p.model_dump(mode="json")}),
            roundtrip_runner=roundtrip,
            roundtrip_prefetch=requests.prefetch,
        )
    except MemoryError:
        write_progress({"refused": "out_of_memory", "message": "MemoryError"})
        return 4
    report = result.report
    changed = _reclassify(report, attempts)
    if changed:
        (out_dir / REPORT).write_text(report.model_dump_json(indent=2))
    # The worker reads the outputs back (into copies) while this process exits.
    write_progress({"done": True})
    return 0


def _reclassify(report: Any, attempts: _Attempts) -> bool:
    """Name the real cause when a failure came from a limit or a forbidden action."""
    from schemas import ReportWarning

    error = report.error
    if error is None:
        if attempts.seen:
            report.warnings.append(
                ReportWarning(
                    code="sandbox_denied",
                    message="The uploaded code tried actions the sandbox forbids: "
                    + ", ".join(sorted(set(attempts.seen.values()))),
                    details={"attempted": sorted(attempts.seen)},
                )
            )
            return True
        return False
    text = f"{error.message} {error.details}"
    if "MemoryError" in text or "Cannot allocate memory" in text:
        error.details = {"original_code": error.code}
        error.code = "out_of_memory"
        error.message = "The job ran out of memory (over its memory_mb limit)."
        error.hint = "Raise `memory_mb`, or use smaller example inputs."
        return True
    if attempts.seen:
        error.details = {
            "original_code": error.code,
            "original_message": error.message,
            "attempted": sorted(attempts.seen),
        }
        error.code = "sandbox_violation"
        error.message = (
            "The uploaded code tried to "
            + ", ".join(sorted(set(attempts.seen.values())))
            + "; the sandbox forbids it."
        )
        error.hint = (
            "Uploaded code may not use the network, start processes or leave its directory."
        )
        return True
    return False


def check_roundtrip(pt2: str, payload: str) -> dict[str, Any]:
    """In the second child: load and run the saved program (imports only torch)."""
    from engine import roundtrip

    return roundtrip.check_saved(pt2, payload)
