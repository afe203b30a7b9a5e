"""What the worker lends a running job and takes back once nothing of it is left: its
concurrency slot (and with it its uid, slots.py), its cgroups (cgroups.py) and its
process tree (tree.py).

Taking back is one step, `release`: the job's leftovers are swept (tree.JobTree.sweep:
every process still in its cgroups, its sessions or of its uid is killed until a scan
finds none), then its cgroups are removed and its slot goes back. A slot whose uid
still has a process after the sweep's time is kept out of use for the worker's life
(logged): a second tenant's job never runs under a uid a process of the first holds.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from worker.sandbox.confinement import cgroups
from worker.sandbox.host.slots import Slot, SlotLeases, default_directories
from worker.sandbox.host.tree import JobTree
from worker.sandbox.settings import SandboxSettings

__all__ = ["JobResources"]

logger = logging.getLogger(__name__)


class JobResources:
    """The runner's slots, cgroups and jobs' trees."""

    def __init__(self, settings: SandboxSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self.leases: SlotLeases | None = None
        self.groups: list[cgroups.JobGroups] = []
        """The runner's parent groups: pids, and memory where the host has a v1 hierarchy."""
        self._stale_groups: list[Path] = []
        """Job cgroups whose last process (a killed loader) was not reaped yet."""
        self._job_groups: dict[str, list[Path]] = {}
        self._trees: dict[str, JobTree] = {}
        self.held_back: list[Slot] = []
        """Slots whose uid kept a process after the sweep: never handed out again."""

    def open(self, work_root: Path) -> None:
        """Open the parent cgroups and the slot leases.

        Raises:
            OSError: jobs drop to uids of their own but no slot directory can be used.
        """
        self.groups = [
            group
            for group in (cgroups.JobGroups.open("pids"), cgroups.JobGroups.open("memory"))
            if group is not None
        ]
        if self.settings.job_ids() is not None:
            candidates = self.settings.slot_dirs or default_directories()
            self.leases = SlotLeases.open([*candidates, work_root / "slots"])

    def close(self) -> None:
        for group in self.groups:
            group.close()
        self.groups = []

    def take_slot(self) -> Slot:
        """The lowest concurrency slot no running job on this machine holds (its uid:
        settings.job_ids); slot 0 where jobs keep the worker's uid."""
        if self.leases is None:
            return Slot(0, None)
        return self.leases.take()

    def groups_for(self, job_id: str, memory_bytes: int) -> dict[str, Path]:
        """This job's cgroups by controller (`pids`, `memory`; none where the host has
        none for us). The memory group's limit is the watchdog's with a margin: the
        watchdog names the job's overrun first, the kernel bounds a faster one."""
        with self._lock:
            self._stale_groups = [g for g in self._stale_groups if not cgroups.JobGroups.remove(g)]
        made: dict[str, Path] = {}
        for parent in self.groups:
            limit = self.settings.pids_max
            if parent.controller == "memory":
                limit = memory_bytes + max(512 << 20, memory_bytes // 4)
            group = parent.create(job_id, limit)
            if group is not None:
                made[parent.controller] = group
        self._job_groups[job_id] = list(made.values())
        return made

    def track(self, job_id: str, tree: JobTree) -> None:
        """The job's processes, swept at `release`."""
        self._trees[job_id] = tree

    def release(self, job_id: str, slot: Slot) -> None:
        """Sweep the job's leftovers, then give back its cgroups and its slot."""
        tree = self._trees.pop(job_id, None)
        left: list[int] = []
        if tree is not None:
            ids = self.settings.job_ids(slot.number)
            left = tree.sweep(
                ids[0] if ids is not None else None,
                any_of_uid=slot.number > 0,  # the slots' own uids are only ever jobs'
                timeout=self.settings.kill_grace_s,
            )
        for group in self._job_groups.pop(job_id, []):
            if not cgroups.JobGroups.remove(group):
                with self._lock:
                    self._stale_groups.append(group)
        if left:
            logger.error(
                "sandbox: job %s left processes %s that did not die; its slot %d (and uid) "
                "stays out of use",
                job_id,
                left[:10],
                slot.number,
            )
            with self._lock:
                self.held_back.append(slot)
            return
        SlotLeases.release(slot)
