"""Memory and disk are limits of a job's whole process tree (worker/sandbox/host/tree.py), not
of the job child alone: the issue's attack had three forked children each touch 800 MB
under `memory_mb: 1024`, and children keep deleted files open past the disk quota, while
the worker read only the job process's own memory and descriptors. Here real processes in
a job's session (and, where the host lets a root worker make one, its pids cgroup) are
counted together, both ways the worker finds them."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.sandbox.confinement import cgroups
from worker.sandbox.host import quota
from worker.sandbox.host.tree import JobTree, read_private, session_members
from worker.sandbox.processes import read_rss

MIB = 1 << 20
EACH_MB = 96
CHILDREN = 3


def _hold(mb: int) -> bytearray:
    """`mb` MiB of this process's own memory, every page touched."""
    held = bytearray(mb * MIB)
    for offset in range(0, len(held), 4096):
        held[offset] = 1
    return held


def _drop_inherited(keep: int) -> None:
    """Close what the leader inherited from pytest but `keep`: pytest's capture files are
    deleted files held open on fds 1 and 2, and a leader holding them would hold the test
    session's captured output as 'its' deleted files."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.closerange(3, keep)
    os.closerange(keep + 1, os.sysconf("SC_OPEN_MAX"))


def _family(group: Path | None, folder: Path) -> Iterator[tuple[int, list[int]]]:
    """A session leader (the 'job child') that forks CHILDREN children, each touching
    EACH_MB of private memory and holding a deleted file of EACH_MB open; yields the
    leader and the children's pids once all are ready, kills them all afterwards."""
    ready_r, ready_w = os.pipe()
    leader = os.fork()
    if leader == 0:  # pragma: no cover - runs in the child
        try:
            os.setsid()
            _drop_inherited(keep=ready_w)
            if group is not None:
                cgroups.join(group)
            for index in range(CHILDREN):
                if os.fork() == 0:
                    _kept = _hold(EACH_MB)  # held until the process ends
                    path = folder / f"deleted-{index}"
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
                    os.write(fd, b"x" * (EACH_MB * MIB))
                    path.unlink()  # fd stays open: the file holds its blocks
                    os.write(ready_w, b"%d\n" % os.getpid())
                    time.sleep(60)
                    os._exit(0)
            time.sleep(60)
        finally:
            os._exit(0)
    os.close(ready_w)
    pids: list[int] = []
    data = b""
    while len(pids) < CHILDREN:
        chunk = os.read(ready_r, 4096)
        assert chunk, "a child died before it was ready"
        data += chunk
        *lines, rest = data.split(b"\n")
        pids += [int(line) for line in lines]
        data = rest
    os.close(ready_r)
    try:
        yield leader, pids
    finally:
        os.killpg(leader, signal.SIGKILL)
        os.waitpid(leader, 0)


def _assert_whole_tree(tree: JobTree, leader: int, children: list[int], folder: Path) -> None:
    members = tree.members()
    assert set(children) | {leader} <= set(members)
    # Each child alone holds a third of what they hold together: a limit of twice one
    # child's memory stops the tree, never one child.
    private = [read_private(pid) for pid in children]
    assert all(EACH_MB * MIB <= held < (EACH_MB + 48) * MIB for held in private)
    assert tree.memory(members) >= read_rss(leader) + CHILDREN * EACH_MB * MIB
    # The deleted files the children hold count against the job's disk quota: the
    # directory itself is empty.
    use = quota.measure(folder, members, 1 << 40, 1 << 40)
    assert use.unlinked_bytes >= CHILDREN * EACH_MB * MIB
    assert quota.measure(folder, [leader], 1 << 40, 1 << 40).unlinked_bytes == 0
    assert use.over((CHILDREN * EACH_MB - 1) * MIB, 1000)


def test_sessions_find_every_process_of_the_job(tmp_path: Path) -> None:
    for leader, children in _family(None, tmp_path):
        tree = JobTree(leaders={leader}, main=leader)
        assert sorted(session_members({leader})) == sorted([leader, *children])
        _assert_whole_tree(tree, leader, children, tmp_path)


@pytest.mark.skipif(os.geteuid() != 0, reason="a job cgroup needs a root worker")
def test_the_jobs_cgroup_lists_every_process_of_the_job() -> None:
    groups = cgroups.JobGroups.open()
    if groups is None:
        pytest.skip("this host lets no root worker make a pids cgroup")
    group = groups.create("tree-test", 64)
    assert group is not None
    folder = Path(tempfile.mkdtemp())
    try:
        for leader, children in _family(group, folder):
            tree = JobTree(group=group, main=leader)  # no leaders known: the group tells
            assert sorted(tree.members()) == sorted([leader, *children])
            _assert_whole_tree(tree, leader, children, folder)
    finally:
        deadline = time.monotonic() + 5
        while not groups.remove(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        groups.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="a job cgroup needs a root worker")
def test_the_kernel_bounds_the_whole_tree_where_a_memory_cgroup_can_be_made() -> None:
    groups = cgroups.JobGroups.open("memory")
    if groups is None:
        pytest.skip("this host lets no root worker make a v1 memory cgroup")
    # Three children of 96 MiB each under a limit of two: one of them is killed by the
    # kernel, whatever the watchdog does, and the group counts it.
    group = groups.create("tree-oom", 2 * EACH_MB * MIB)
    assert group is not None
    assert cgroups.limit(group) == {"memory_max_mb": 2 * EACH_MB}
    try:
        ready_r, ready_w = os.pipe()
        leader = os.fork()
        if leader == 0:  # pragma: no cover - runs in the child
            try:
                os.setsid()
                cgroups.join(group)
                os.close(ready_r)
                for _ in range(CHILDREN):
                    if os.fork() == 0:
                        _kept = _hold(EACH_MB)  # held until the process ends
                        time.sleep(30)
                        os._exit(0)
                deadline = time.monotonic() + 20
                while time.monotonic() < deadline and not cgroups.oom_kills(group):
                    time.sleep(0.05)
                os.write(ready_w, b"x")
            finally:
                os._exit(0)
        os.close(ready_w)
        os.read(ready_r, 1)
        os.close(ready_r)
        assert cgroups.oom_kills(group) >= 1
        os.killpg(leader, signal.SIGKILL)
        os.waitpid(leader, 0)
    finally:
        deadline = time.monotonic() + 5
        while not groups.remove(group) and time.monotonic() < deadline:
            time.sleep(0.05)
        groups.close()
