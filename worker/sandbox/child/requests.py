"""A job child's requests to the zygote: round trips (loader.py) and toolchain programs
(toolchain.py), one JSON line each way over the pipes the zygote gave it (fd 4 out, fd 5
back). Runs inside the locked-down job child.

`BrokeredPopen` stands in for `subprocess.Popen` in the job child: the strict profile
refuses every exec, so a conversion's `subprocess.run(["g++", ...])` (torch's inductor)
or `subprocess.run([flatc, ...])` (executorch) becomes a toolchain request naming the
command's kind and files (`toolchain_commands.describe`: only an argv that is exactly a
template's), which the zygote hands to a child of its own that builds the command from
its templates and runs it. Anything refused raises `PermissionError`, as a refused exec
would.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from engine.targets import time_budget
from worker.sandbox import protocol
from worker.sandbox.confinement.converters import directories
from worker.sandbox.zygote.relay import TOOLCHAIN
from worker.sandbox.zygote.toolchain_commands import Paths, Refused, describe

__all__ = ["BrokeredPopen", "Channel", "channel", "install"]

REQUEST_FD = 4
ANSWER_FD = 5
MAX_ANSWER = 1 << 20
MAX_OUTPUT = 4 << 20
"""Of a toolchain program's output files, what the job reads back (a compiler's errors)."""


class Channel:
    """The request pipe and the answer pipe, with the answers sorted by kind: a round
    trip's answer may come while a toolchain program runs (a loader that died early)."""

    def __init__(self, request_fd: int = REQUEST_FD, answer_fd: int = ANSWER_FD) -> None:
        self.request_fd, self.answer_fd = request_fd, answer_fd
        self.buffer = b""
        self.pending: dict[str, list[dict[str, Any]]] = {"roundtrip": [], "toolchain": []}

    def send(self, request: dict[str, Any], prefix: bytes = b"") -> None:
        os.write(self.request_fd, prefix + (json.dumps(request) + "\n").encode())

    def receive(self, kind: str) -> dict[str, Any] | None:
        """The next answer of `kind` ("roundtrip" or "toolchain"); None when the zygote
        closed the pipe or sent something that is not an answer."""
        while not self.pending[kind]:
            line = self._line()
            if line is None:
                return None
            try:  # a loader's line as the zygote passed it on: parsed here, within bounds
                parsed = protocol.loads_untrusted(line, MAX_ANSWER)
            except ValueError:
                return None
            self.pending["toolchain" if parsed.get("toolchain") else "roundtrip"].append(parsed)
        return self.pending[kind].pop(0)

    def _line(self) -> bytes | None:
        while b"\n" not in self.buffer:
            if len(self.buffer) > MAX_ANSWER:
                return None
            chunk = os.read(self.answer_fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line


_channel: Channel | None = None


def channel() -> Channel:
    """This process's channel to the zygote."""
    global _channel
    if _channel is None:
        _channel = Channel()
    return _channel


class BrokeredPopen:
    """As much of `subprocess.Popen` as `subprocess.run`, `check_output` and `check_call`
    use, for programs the zygote runs: the program runs to its end when the object is
    made; its output is read back from the job's scratch directory."""

    def __init__(self, args: Any, *popenargs: Any, **kwargs: Any) -> None:
        self.args = args
        given = [os.fspath(a) for a in ([args] if isinstance(args, str | bytes) else args)]
        argv = [a.decode() if isinstance(a, bytes) else str(a) for a in given]
        if kwargs.get("shell") or popenargs:
            self._refuse(argv, "a shell or positional Popen arguments")
        self.pid = -1
        self.stdin = self.stdout = self.stderr = None
        self._text = bool(
            kwargs.get("text") or kwargs.get("universal_newlines") or kwargs.get("encoding")
        )
        merge = kwargs.get("stderr") == subprocess.STDOUT
        try:
            request = describe(argv, _paths())
        except Refused as exc:
            self._refuse(argv, str(exc))
        request["merge"] = merge
        link = channel()
        # A target's time budget that runs out meanwhile waits for the answer: raised in
        # between, it would leave the answer to the next request (engine.targets.time_budget).
        with time_budget.deferred():
            link.send(request, prefix=TOOLCHAIN)
            reply = link.receive("toolchain") or {"refused": "the zygote gave no answer"}
        if reply.get("rc") is None:
            self._refuse(argv, str(reply.get("refused")))
        self.returncode: int = int(reply["rc"])
        out, err = _outputs(int(reply.get("run") or 0))
        self._out = out if kwargs.get("stdout") == subprocess.PIPE else None
        self._err = None if merge or kwargs.get("stderr") != subprocess.PIPE else err

    @staticmethod
    def _refuse(argv: list[str], why: str) -> None:
        sys.audit("subprocess.Popen", argv[0] if argv else "", argv, None, None)
        raise PermissionError(1, f"the sandbox runs no such program ({why})", argv[0])

    def _decoded(self, data: bytes | None) -> Any:
        if data is None or not self._text:
            return data
        return data.decode(errors="replace")

    def communicate(self, input: Any = None, timeout: float | None = None) -> tuple[Any, Any]:
        return self._decoded(self._out), self._decoded(self._err)

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode

    def poll(self) -> int:
        return self.returncode

    def kill(self) -> None:
        pass

    terminate = kill

    def __enter__(self) -> BrokeredPopen:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def _outputs(run: int) -> tuple[bytes, bytes]:
    """What toolchain run number `run` wrote (toolchain.output_paths, in $TMPDIR)."""
    folder = Path(os.environ.get("TMPDIR", "/tmp")) / ".toolchain"
    found = []
    for name in (f"{run}.out", f"{run}.err"):
        try:
            with open(folder / name, "rb") as handle:
                found.append(handle.read(MAX_OUTPUT))
        except OSError:
            found.append(b"")
    return found[0], found[1]


@functools.cache
def _paths() -> Paths:
    """The include and library directories the broker's templates name, as this process
    finds them (the broker uses the worker's: the same interpreter and torch)."""
    include, libdirs = directories()
    return Paths(gxx=None, flatc=None, include=tuple(include), libdirs=tuple(libdirs))


def install() -> None:
    """From now on, this process starts programs through the toolchain broker."""
    subprocess.Popen = BrokeredPopen  # type: ignore[misc, assignment]
