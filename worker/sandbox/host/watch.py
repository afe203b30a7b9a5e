"""What the worker learns about one running job (`Watch`): filled by the zygote client's
reader and the job's pipes, read by the supervisor and the results. Its own module so that
the zygote client and the supervisor each depend on it and not on each other."""

from __future__ import annotations

import queue
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from worker.sandbox.host import quota
from worker.sandbox.host.tree import JobTree

if TYPE_CHECKING:
    from worker.sandbox.host.outputs import Accepted

__all__ = ["Watch"]


@dataclass
class Watch:
    """What the worker learns about one running job."""

    messages: queue.Queue[dict[str, Any]] = field(default_factory=queue.Queue)
    lockdown: dict[str, Any] | None = None
    refused: tuple[str, str] | None = None
    bad_lines: int = 0
    spare: bool = False
    """The job ran in a pre-forked, self-warmed spare child rather than a fresh fork."""
    prefault: bool = False
    """A fresh fork that faulted in the pages a spare's warm-up touches before the job."""
    quiet: bool = False
    """The job entered a stage that keeps one core busy (protocol.QUIET_STAGES)."""
    done: bool = False
    """The child said its outputs are written (it is about to exit)."""
    accepted: Accepted | None = None
    """Its outputs, read, validated and copied out of its reach while it exited."""
    roundtrips: dict[str, int] | None = None
    """Round trips the zygote ran for the job: how many, how many in a spare loader."""
    disk: quota.DiskUse | None = None
    """The largest disk use measured while the job ran (the last one, if over)."""
    tree: JobTree = field(default_factory=JobTree)
    """Every process of the job (tree.py): memory and disk are limits of all of them."""
    tree_peak: int = 0
    """The most memory the job's processes were seen to hold together, in bytes."""
