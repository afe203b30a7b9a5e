"""The zygote's spares, and the pages they learn.

The zygote keeps one forked *spare* job child and one spare loader child. The first
spare of each kind runs the zygote's own warm-up once more in its own
address space (so the copy-on-write faults and cold caches of a fresh fork are paid
while the worker is idle) and learns from its page map which pages that touched
(pages.py); later spares, and fresh forks when no spare is ready, fault those pages in
with madvise instead (~50 ms against ~750 ms). A spare then says `ready` and waits on
a private socket. The next CPU job (or round trip) is handed to the ready spare, which
only then locks itself down exactly as a freshly forked child would and runs it.

Once a kind's pages are learned, a spare of it that is missing (handed work, or died)
is *owed*: it is forked (~50-75 ms of one core, faulting in pages) when a running job
reaches a stage that keeps one core busy (the worker passes on `quiet` when a job starts
decomposing: `protocol.QUIET_STAGES`), when no job has run for `REFILL_AFTER_S`, or at
once when work finds no spare of its kind. Not the moment its predecessor is handed its
work: that faulting ran beside the job's loading (its model's forward, OpenMP threads on
both cores) and a loader's beside verification. Work that finds its kind's spare still
faulting waits for it (`FAULTING_WAIT_S` at most: a fresh fork would fault the same
pages in); work that finds none (two jobs at once, or a job that ended before its quiet
stage) gets a fresh fork. A spare still running the slow warm-up is killed when work
comes (it would compete with the job for the CPU). The successor first closes every
descriptor it inherited but its own socket (the running work's pipes among them). GPU
jobs always get a fresh fork, never prefaulted.

Messages (zygote → spare): `job` (fds: progress, output, round-trip request and
answer), `load` (fds: output, answer, payload path in). (spare → zygote): `ready`
(with the name of its learned-pages file in the warm-up directory, the first of a
kind), then (zygote → worker) `spares` with the kinds now ready and the pages learned
per kind.
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import selectors
import signal
import socket
import sys
import time
import traceback
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker.sandbox import protocol
from worker.sandbox.child import run as child
from worker.sandbox.confinement.lockdown import PR_SET_PDEATHSIG, max_fd, prctl
from worker.sandbox.processes import close_fd, kill_group, read_status_mb
from worker.sandbox.zygote import pages
from worker.sandbox.zygote.loader import load
from worker.sandbox.zygote.warmup import warm_spare

if TYPE_CHECKING:
    from worker.sandbox.zygote.job import ZygoteHost

__all__ = ["FAULTING_WAIT_S", "MAX_SPARE_FAILURES", "REFILL_AFTER_S", "Spare", "Spares"]

REFILL_AFTER_S = 0.1
"""How long the zygote is without jobs before it forks the spares it lacks."""
FAULTING_WAIT_S = 0.25
"""How long work waits for its kind's spare that is still faulting in learned pages
(~50 ms of one core) before it takes a fresh fork, which would fault them in too."""

MAX_SPARE_FAILURES = 3
"""Spares that die before they are ready, in a row, before the zygote stops making them."""


@dataclass
class Spare:
    """A forked child that warmed itself up and waits for one job or one round trip."""

    kind: str
    pid: int
    sock: socket.socket
    ready: bool = False
    rss_mb: int = 0
    """Its resident size when it said ready (the worker's RSS limit allows for the rest)."""


class Spares:
    """The zygote's spares (one per kind at most) and the pages their warm-ups taught."""

    def __init__(self, zygote: ZygoteHost) -> None:
        self.zygote = zygote
        self.children: dict[str, Spare] = {}
        self.enabled = False
        self.failures = 0
        self.maps: list[pages.Mapping] = []
        """The zygote's mappings once warm: what learned page ranges refer to."""
        self.pages: dict[str, array] = {}
        """Per spare kind, the page ranges its warm-up touched (pages.py), once learned."""
        self.learned: dict[str, dict[str, int]] = {}
        """Per spare kind, how many pages those ranges hold (told to the worker)."""
        self.idle_since: float | None = float("-inf")
        """When the zygote last became without jobs (monotonic); None while one runs."""

    def keep(self) -> float | None:
        """Once no job has run for `REFILL_AFTER_S`, make sure a spare of each kind exists
        (or is warming); while jobs run, successors come from `fork_owed` and `take`.
        Returns how long until this wants to be called again (None: no need)."""
        if not self.enabled or self.zygote.jobs:
            self.idle_since = None
            return None
        now = time.monotonic()
        if self.idle_since is None:
            self.idle_since = now
        missing = [kind for kind in protocol.SPARE_KINDS if kind not in self.children]
        if not missing:
            return None
        if (wait := self.idle_since + REFILL_AFTER_S - now) > 0:
            return wait
        for kind in missing:
            self._fork(kind)
        return None

    def _owes(self, kind: str) -> bool:
        """Whether a spare of `kind` is missing that only needs to fault in learned pages."""
        return self.enabled and kind in self.pages and kind not in self.children

    def fork_owed(self) -> None:
        """A job entered a quiet stage: fork the spares owed (they fault in learned pages
        on the core the job leaves free)."""
        for kind in protocol.SPARE_KINDS:
            if self._owes(kind):
                self._fork(kind)

    def _fork(self, kind: str) -> None:
        try:
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        except OSError:
            self._failed()
            return
        try:
            pid = os.fork()
        except OSError:  # out of processes or memory: work gets fresh forks meanwhile
            ours.close()
            theirs.close()
            self._failed()
            return
        if pid == 0:
            try:
                ours.close()
                self._main(kind, theirs)
            finally:
                os._exit(70)
        theirs.close()
        self.children[kind] = Spare(kind, pid, ours)
        self.zygote.selector.register(ours, selectors.EVENT_READ, ("spare", kind))

    def _main(self, kind: str, sock: socket.socket) -> None:
        """In the spare: warm up, say ready, wait for work, then become that child.
        Runs only the zygote's own code until the work arrives; never returns."""
        try:
            self.zygote.detach()
            # A successor forked while work runs (hand_over) would hold that work's pipes
            # (its progress and output fds, its round-trip pipes) open until it locks
            # down: keep only the standard streams and its own socket.
            os.closerange(3, sock.fileno())
            os.closerange(sock.fileno() + 1, max_fd())
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # an idle spare dies with the zygote
            learned, saved = self.pages.get(kind), None
            if learned is not None:
                pages.prefault(learned)
            else:
                warm_spare(kind, Path(self.zygote.config["warm_dir"]))
                gc.collect()
                gc.freeze()
                if self.maps:
                    saved = self._save_pages(kind)
            data_mb = read_status_mb("VmData")
            protocol.send(sock, {"op": "ready", "rss_mb": read_status_mb("VmRSS"), "pages": saved})
            message, fds = protocol.receive(sock)
            sock.close()
        except BaseException:
            with contextlib.suppress(BaseException):
                traceback.print_exc()
                sys.stderr.flush()
            os._exit(70)
        if message is None:
            os._exit(0)
        try:
            self._become_handed_work(kind, message, fds, data_mb)
        finally:  # never back into the zygote's loop, whatever went wrong
            os._exit(70)

    def _pages_file(self, kind: str, pid: int) -> Path:
        return Path(self.zygote.config["warm_dir"]) / f"pages-{kind}-{pid}.bin"

    def _save_pages(self, kind: str) -> str | None:
        """In a spare that warmed up the slow way: write the ranges it touched for the
        zygote (pages.learn); their file's name, None when the page map is unreadable."""
        try:
            path = self._pages_file(kind, os.getpid())
            pages.save(path, pages.learn(self.maps))
        except OSError:
            return None
        return path.name

    def _take_pages(self, spare: Spare, name: Any) -> None:
        """Keep the ranges a spare learned (the first of its kind that warmed up)."""
        path = self._pages_file(spare.kind, spare.pid)
        if name != path.name:
            return
        learned = pages.load(path)
        with contextlib.suppress(OSError):
            path.unlink()
        if learned is not None and spare.kind not in self.pages:
            self.pages[spare.kind] = learned
            self.learned[spare.kind] = pages.count(learned)

    def _become_handed_work(
        self, kind: str, message: dict[str, Any], fds: list[int], data_mb: int
    ) -> None:
        zygote = self.zygote
        # RLIMIT_DATA counts what the spare allocated while warming up; the job's own
        # budget stays what it would be in a fresh fork.
        grown = max(0, data_mb - zygote.data_mb)

        def limits(given: dict[str, int]) -> dict[str, int]:
            return {**given, "memory_mb": int(given["memory_mb"]) + grown}

        if kind == "job" and message.get("op") == "job" and len(fds) == 4:
            run = message["run"]
            conf = zygote.job_confinement(run["dirs"], limits(run["limits"]), False, fds)
            root = run["dirs"]["root"]
            zygote.become_child(conf, lambda: child.run_export_job(root), detached=True)
        elif kind == "loader" and message.get("op") == "load" and len(fds) == 3:
            pt2, threads = str(message["pt2"]), int(message["threads"])
            given = limits(message["limits"])
            conf = zygote.loaders.confinement(message["dirs"], given, False, fds)
            zygote.become_child(conf, lambda: load(pt2, threads), announce=False, detached=True)

    def on_message(self, kind: str, sock: socket.socket | None = None) -> None:
        """A spare said `ready` (or died: its socket closed). `sock`: the socket the event
        was for (a stale event of a spare taken since is ignored)."""
        spare = self.children.get(kind)
        if spare is None or (sock is not None and sock is not spare.sock):
            return
        try:
            message, fds = protocol.receive(spare.sock)
        except (OSError, ValueError):
            message, fds = None, []
        for fd in fds:
            close_fd(fd)
        if message is not None and message.get("op") == "ready" and not spare.ready:
            spare.ready = True
            spare.rss_mb = int(message.get("rss_mb", 0))
            if message.get("pages"):
                self._take_pages(spare, message["pages"])
            self.failures = 0
            self.tell()
            return
        self.drop(spare, failed=True)

    def take(self, kind: str) -> Spare | None:
        """The ready spare of this kind, now owned by the caller. Work never waits for a
        spare still warming: one warming up the slow way (~700 ms: nothing learned for
        its kind yet) is killed, so as not to share the CPU with the work. One of this
        kind faulting in learned pages (~50 ms) is waited for, `FAULTING_WAIT_S` at most
        (one of the other kind is left to finish). None: the caller forks afresh, and an
        owed successor of this kind is forked now, for the work after it."""
        for other in list(self.children.values()):
            if not other.ready and other.kind not in self.pages:
                self.drop(other, failed=False)
        spare = self.children.get(kind)
        if spare is not None and not spare.ready:
            with contextlib.suppress(OSError, ValueError):
                if select.select([spare.sock], [], [], FAULTING_WAIT_S)[0]:
                    self.on_message(kind, spare.sock)
            spare = self.children.get(kind)
        if spare is None or not spare.ready:
            if self._owes(kind):  # for the work after this one
                self._fork(kind)
            return None
        del self.children[kind]
        self.zygote.selector.unregister(spare.sock)
        self.tell()
        return spare

    def tell(self) -> None:
        """Tell the worker which spares are ready (benchmarks and tests wait for them)."""
        ready = sorted(kind for kind, spare in self.children.items() if spare.ready)
        with contextlib.suppress(OSError):
            protocol.send(
                self.zygote.ctl, {"op": "spares", "ready": ready, "learned": self.learned}
            )

    def hand_over(self, spare: Spare, message: dict[str, Any], fds: list[int]) -> bool:
        """Send a taken spare its work (its successor is then owed: `fork_owed`); False
        (and the spare killed) when sending fails."""
        try:
            protocol.send(spare.sock, message, fds)
        except (OSError, ValueError):  # gone, or the message too large: a fresh fork
            kill_group(spare.pid)
            return False
        finally:
            spare.sock.close()
        return True

    def drop(self, spare: Spare, failed: bool) -> None:
        """Kill a spare; after `MAX_SPARE_FAILURES` failed ones in a row, stop making them."""
        if self.children.get(spare.kind) is not spare:
            return
        del self.children[spare.kind]
        if spare.ready:
            self.tell()
        with contextlib.suppress(KeyError, ValueError):
            self.zygote.selector.unregister(spare.sock)
        spare.sock.close()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(spare.pid, signal.SIGKILL)
        if failed:
            self._failed()

    def _failed(self) -> None:
        """A spare died before it was ready (or could not be forked); after
        `MAX_SPARE_FAILURES` in a row, stop making them."""
        self.failures += 1
        if self.failures >= MAX_SPARE_FAILURES and self.enabled:
            self.enabled = False
            for other in list(self.children.values()):  # as the log line says
                self.drop(other, failed=False)
            print(
                f"torchport zygote: {self.failures} spares died before they were "
                "ready; jobs get fresh forks from now on",
                file=sys.stderr,
                flush=True,
            )

    def reap(self, pid: int) -> None:
        """A child of the zygote exited: if it was a spare, it failed."""
        for spare in list(self.children.values()):
            if pid == spare.pid:
                self.drop(spare, failed=True)

    def drop_all(self) -> None:
        """Kill every spare (the zygote is shutting down)."""
        for spare in list(self.children.values()):
            self.drop(spare, failed=False)

    def close_sockets(self) -> None:
        """In a fresh fork: let go of the spares' sockets (the zygote's, not the child's)."""
        for spare in self.children.values():
            spare.sock.close()
