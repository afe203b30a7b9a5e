"""Round trips, brokered by the zygote: a job child asks on its request pipe for a
loader of the program it saved (`{"pt2", "threads"}`), the zygote forks one (or hands
the request to a ready spare loader), passes the payload's path on when the job sends
it (`{"payload"}`), and writes the loader's one-line answer back to the job. A job whose
program changed after the prefetch drops its loader (`{"drop": true}`, answered
`{"dropped": true}`).

The job is untrusted: every line it writes is parsed within bounds, its paths reach
only a locked-down loader, and at most `MAX_ROUNDTRIPS` loaders run per job. `load`
is what runs in the loader child itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import struct
import termios
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.sandbox import protocol
from worker.sandbox.child import run as child
from worker.sandbox.child.requests import MAX_ANSWER
from worker.sandbox.confinement.lockdown import Confinement
from worker.sandbox.processes import close_fd, describe_status, kill_group
from worker.sandbox.zygote.relay import MAX_REQUEST, TOOLCHAIN, Relay, UnreadAnswer

if TYPE_CHECKING:
    from worker.sandbox.zygote.job import Job, ZygoteHost

__all__ = ["MAX_REQUEST", "MAX_ROUNDTRIPS", "Loaders", "answer", "load"]

MAX_ROUNDTRIPS = 4


class Loaders:
    """The zygote's side of its jobs' round trips (the state is each `Job`'s)."""

    def __init__(self, zygote: ZygoteHost) -> None:
        self.zygote = zygote

    def on_request(self, job: Job) -> None:
        """Read what the job wrote on its request pipe; a line over `MAX_REQUEST` kills it.
        Toolchain requests go to the broker as bytes (toolchain.py); the lines are zeroed
        once handled (relay.Requests)."""
        try:
            got = job.requests.read_from(job.request_fd)
        except OSError:
            got = 0
        if not got:
            if job.requests.length == len(job.requests.buffer):  # one line fills it all
                job.stop("a round-trip request line over its size limit")
                return
            self.zygote.selector.unregister(job.request_fd)
            close_fd(job.request_fd)
            job.request_fd = -1
            return
        while (line := job.requests.next_line()) is not None:
            if line[: len(TOOLCHAIN)] == TOOLCHAIN:
                self.zygote.toolchains.on_request(job, line[len(TOOLCHAIN) :])
            else:
                self._on_request_line(job, bytes(line))
        job.requests.drop_used()

    def _on_request_line(self, job: Job, line: bytes) -> None:
        """`{"pt2", "threads"}` starts a loader on that program; `{"payload"}` hands the
        running loader its payload (both in one line: both); `{"drop": true}` stops it.
        Anything else: a failed answer. The job is untrusted: its paths reach only a
        locked-down loader."""
        try:
            request = protocol.loads_untrusted(line, MAX_REQUEST)
            if request.get("drop") is True:
                self.drop(job)
                return
            pt2 = request.get("pt2")
            payload = request.get("payload")
            if pt2 is None and payload is None:
                raise ValueError("neither pt2 nor payload")
            if not all(isinstance(p, str | None) for p in (pt2, payload)):
                raise ValueError("paths must be strings")
            cpus = len(os.sched_getaffinity(0))
            wanted = request.get("threads") or cpus
            if not isinstance(wanted, int) or isinstance(wanted, bool):
                raise ValueError("threads must be an integer")
            threads = max(1, min(wanted, cpus))
        except Exception:  # whatever a job writes, the zygote lives on
            answer(job, {"status": "failed", "reason": "malformed round-trip request"})
            return
        if pt2 is not None:
            if job.loader_pid is not None or job.roundtrips >= MAX_ROUNDTRIPS:
                answer(job, {"status": "failed", "reason": "too many round-trip requests"})
                return
            job.roundtrips += 1
            self._fork(job, str(pt2), threads)
        if payload is not None:
            if job.loader_in is None:
                answer(job, {"status": "failed", "reason": "no loader for this payload"})
                return
            with contextlib.suppress(OSError):
                os.write(job.loader_in, (json.dumps({"payload": str(payload)}) + "\n").encode())
            close_fd(job.loader_in)
            job.loader_in = None

    def drop(self, job: Job) -> None:
        """`{"drop"}`: kill the job's loader, unheard (its program changed), and say
        `{"dropped": true}`; an answer it gave before went to the job before this one."""
        if job.loader_pid is not None:
            self.finish(job, None, answering=False)
        answer(job, {"dropped": True})

    def confinement(
        self, dirs: dict[str, str], limits: dict[str, int], gpu: bool, fds: list[int]
    ) -> Confinement:
        """A loader child's confinement; `fds`: output, answer, payload path in."""
        output, answer_fd, payload = fds
        scratch = str(Path(dirs["tmp"]) / "loader")
        conf = self.zygote.confinement({**dirs, "tmp": scratch}, limits, [scratch], gpu)
        conf.keep_fds = {1: output, 2: output, 3: answer_fd, 4: payload}
        return conf

    def _fork(self, job: Job, pt2: str, threads: int) -> None:
        """The second child: a fork of this torch-only process loads the program (a ready
        spare loader when there is one, a fresh fork otherwise), then waits for the
        payload's path on its fd 4."""
        zygote = self.zygote
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(out_r, False)  # the zygote never waits on a loader
        in_r, in_w = os.pipe2(os.O_CLOEXEC)
        job.loader_started = time.perf_counter()
        spare = None if job.gpu else zygote.spares.take("loader")
        handed = {"op": "load", "pt2": pt2, "threads": threads}
        handed.update(dirs=job.dirs, limits=job.limits)
        fds = [job.output_fd, out_w, in_r]
        if spare is not None and zygote.spares.hand_over(spare, handed, fds):
            pid = spare.pid
            job.loader_spares += 1
        else:
            conf = self.confinement(job.dirs, job.limits, job.gpu, fds)
            learned = None if job.gpu else zygote.spares.pages.get("loader")
            pid = os.fork()
            if pid == 0:
                work = lambda: load(pt2, threads)  # noqa: E731
                zygote.become_child(conf, work, announce=False, prefault=learned)
        os.close(out_w)
        os.close(in_r)
        zygote.announce_helper(job, pid)
        job.loader_pid, job.loader_fd, job.loader_out = pid, out_r, Relay(MAX_ANSWER)
        job.loader_in = in_w
        zygote.selector.register(out_r, selectors.EVENT_READ, ("loader", job.id))

    def on_output(self, job: Job) -> None:
        """Read the loader's answer; answer the job as soon as its line is complete."""
        assert job.loader_fd is not None and job.loader_out is not None
        try:
            got = job.loader_out.read_from(job.loader_fd)
        except BlockingIOError:
            return  # nothing yet (a stale event for a pipe of this number)
        except OSError:
            got = 0
        if not got or job.loader_out.line_length() or job.loader_out.full:
            # Answer as soon as the line is complete: the job need not wait for the
            # loader's exit. The loader is done: it is killed now, and reaped later.
            self.finish(job, None)

    def finish(self, job: Job, status: int | None, *, answering: bool = True) -> None:
        """Answer the job from the loader's output (or its death) and let it go; a loader
        dropped (`answering` false) goes unheard."""
        if answering:
            self._answer_from_loader(job, status)
        elif job.loader_out is not None:
            job.loader_out.clear()
            job.loader_out = None
        close_fd(job.loader_in)
        job.loader_in = None
        if job.loader_fd is not None:
            self.zygote.selector.unregister(job.loader_fd)
            close_fd(job.loader_fd)
            job.loader_fd = None
        if job.loader_pid is not None:
            if status is None:  # still alive: its answer is all we wanted from it
                kill_group(job.loader_pid)
                job.old_loaders.append(job.loader_pid)
            job.loader_pid = None

    def _answer_from_loader(self, job: Job, status: int | None) -> None:
        """Pass the loader's line on unparsed (relay.py), or say that it gave none."""
        relay, job.loader_out = job.loader_out, None
        try:
            passed = relay is not None and relay.pass_on(job.answer_fd)
        except UnreadAnswer:
            job.stop("a round-trip answer left unread")
            passed = True
        if not passed:
            died = "no answer" if status is None else describe_status(status)
            reason, duration = f"the loader died ({died})", time.perf_counter() - job.loader_started
            answer(job, {"status": "failed", "reason": reason, "duration_s": duration})
        if relay is not None:
            relay.clear()

    def drain(self, job: Job) -> None:
        """Read what an exited loader left in its pipe (up to an answer's size)."""
        assert job.loader_fd is not None and job.loader_out is not None
        os.set_blocking(job.loader_fd, False)
        try:
            while job.loader_out.read_from(job.loader_fd):
                pass
        except OSError:
            pass


def answer(job: Job, reply: dict[str, Any]) -> None:
    """Write one answer line to the job's round-trip answer pipe (gone: nothing). A job
    whose pipe is half full has not read its answers (a flood of requests; an honest job
    leaves one or two): it is killed rather than waited for, since the zygote serves
    every tenant. Half: small writes fill the pipe's pages only nearly, so a pipe of
    64 KiB blocked a write of 18 bytes with 65,376 bytes unread."""
    line = (json.dumps(reply) + "\n").encode()
    with contextlib.suppress(OSError):
        room = fcntl.fcntl(job.answer_fd, fcntl.F_GETPIPE_SZ) // 2
        if _unread(job.answer_fd) + len(line) > room:
            job.stop("round-trip answers left unread (a flood of requests)")
            return
        os.write(job.answer_fd, line)


def _unread(fd: int) -> int:
    """The bytes written to pipe `fd` and not read yet."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])


def load(pt2: str, threads: int) -> int:
    """In a loader child: load the program, then wait for the payload's path on fd 4 (the
    job writes the payload meanwhile), run and compare; the one-line answer goes to fd 3."""
    import torch

    from engine.serialize import roundtrip

    started = time.perf_counter()
    torch.set_num_threads(threads)
    try:
        loaded = roundtrip.load_saved(pt2)
        request = child.read_line(4, MAX_REQUEST)
        if not request.endswith(b"\n") and len(request) < MAX_REQUEST:
            return 0  # the job went away or sent no payload: nothing to answer
        payload = str(protocol.loads_untrusted(request, MAX_REQUEST)["payload"])
        reply = roundtrip.run_loaded(loaded, payload)
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"[:2000]
        reply = {"status": "failed", "reason": reason, "duration_s": time.perf_counter() - started}
    os.write(3, (json.dumps(reply) + "\n").encode())
    return 0
