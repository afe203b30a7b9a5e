"""What the zygote's rooms share: a job child and the state of its helpers (`Job`), and
what loader.py, spares.py and toolchain.py need of the zygote (`ZygoteHost`, which
`zygote.Zygote` is). Its own module so that those rooms depend on it and not on zygote.py,
which depends on them."""

from __future__ import annotations

import selectors
import socket
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from worker.sandbox.confinement.lockdown import Confinement
from worker.sandbox.processes import kill_group
from worker.sandbox.zygote.relay import MAX_REQUEST, Relay, Requests

__all__ = ["Job", "ZygoteHost"]


@dataclass
class Job:
    """A job child of the zygote, with the state of its round trips (loader.py)."""

    id: str
    pid: int
    output_fd: int
    request_fd: int
    answer_fd: int
    dirs: dict[str, str]
    limits: dict[str, int]
    requests: Requests = field(default_factory=lambda: Requests(MAX_REQUEST))
    """What the job wrote on its request pipe, zeroed as it is used."""
    roundtrips: int = 0
    killed_for: str | None = None
    """Why the zygote killed the job, when it did (a request line too long, answers left
    unread): reported as `sandbox_violation`, not as the memory killer's SIGKILL."""
    loader_spares: int = 0
    loader_pid: int | None = None
    loader_fd: int | None = None
    loader_in: int | None = None
    loader_out: Relay | None = None
    """The loader's answer on its way to the job, never parsed here (relay.py)."""
    loader_started: float = 0.0
    old_loaders: list[int] = field(default_factory=list)
    """Loaders that answered and were killed, not yet reaped."""
    closed: list[int] = field(default_factory=list)
    gpu: bool = False
    toolchain_pid: int | None = None
    """The job's running toolchain child (toolchain.py), if any."""
    toolchain_status: int | None = None
    """Its status pipe: "R" when it refused the request (and answered it) itself; closed
    without a byte when it exec'd the program."""
    toolchain_runs: int = 0

    def stop(self, reason: str) -> None:
        """Kill the job's process group for `reason` (`killed_for`)."""
        self.killed_for = reason
        kill_group(self.pid)

    def roundtrip_counts(self) -> dict[str, int]:
        """How many loaders the job had, and how many of them were spares (for the
        worker's `details.roundtrips`, in `finishing` and `exited`)."""
        return {"loaders": self.roundtrips, "in_spares": self.loader_spares}

    def helpers(self) -> list[int]:
        """The job's other processes: its loaders and its toolchain child."""
        pids = [self.loader_pid, *self.old_loaders, self.toolchain_pid]
        return [pid for pid in pids if pid is not None]


class ZygoteHost(Protocol):
    """The zygote as its rooms (loaders, spares, toolchains) use it."""

    ctl: socket.socket
    config: dict[str, Any]
    jobs: dict[str, Job]
    selector: selectors.BaseSelector
    spares: Any
    """spares.Spares"""
    loaders: Any
    """loader.Loaders"""
    toolchains: Any
    """toolchain.Toolchains"""
    data_mb: int

    def confinement(
        self,
        dirs: dict[str, str],
        limits: dict[str, int],
        writable: list[str],
        gpu: bool,
        exec_programs: bool = False,
    ) -> Confinement: ...

    def announce_helper(self, job: Job, pid: int) -> None: ...

    def kill_strays(self) -> None: ...

    def job_confinement(
        self, dirs: dict[str, str], limits: dict[str, int], gpu: bool, fds: list[int]
    ) -> Confinement: ...

    def detach(self) -> None: ...

    def become_child(
        self,
        conf: Confinement,
        work: Callable[[], Any],
        announce: bool = True,
        detached: bool = False,
        prefault: array | None = None,
    ) -> None: ...
