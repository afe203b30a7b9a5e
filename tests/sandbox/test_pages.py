"""pages.py: what a fork's warm-up touched is learned from its page map, and a later
fork that faults those ranges in ahead takes no page fault on them. Asserted by effect:
the kernel's count of page faults (ru_minflt) while the pages are used."""

from __future__ import annotations

import ctypes
import mmap
import os
import resource
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest

from worker.sandbox.zygote import pages

PAGES = 64
TOUCHED = [*range(10, 20), *range(40, 50)]

pytestmark = pytest.mark.skipif(not pages.supported(), reason="needs MADV_POPULATE_*")


def _in_fork(work: Callable[[], bytes]) -> bytes:
    """Run `work` in a forked child; its bytes back through a pipe."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.write(write_end, work())
        except BaseException:
            code = 1
        os._exit(code)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 1 << 16):
        chunks.append(chunk)
    os.close(read_end)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return b"".join(chunks)


def _faults(use: Callable[[], None]) -> int:
    """Page faults while `use` runs (the measuring itself warmed up first)."""

    def measure(work: Callable[[], None]) -> int:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        work()
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    for _ in range(3):
        measure(lambda: None)
    return measure(use)


def _address(buffer: mmap.mmap) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


def _ranges_of(data: bytes) -> array:
    ranges = array("Q")
    ranges.frombytes(data)
    return ranges


def _covered(ranges: array, kind: int, start: int) -> list[int]:
    """Which of the buffer's pages (by index from `start`) the ranges of `kind` hold."""
    held = []
    for page in range(PAGES):
        address = start + page * pages.PAGE
        for index in range(0, len(ranges), 3):
            if ranges[index + 2] == kind and ranges[index] <= address < ranges[index + 1]:
                held.append(page)
                break
    return held


def test_written_pages_are_learned_and_prefaulted_ahead() -> None:
    buffer = mmap.mmap(-1, PAGES * pages.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buffer.write(b"x" * len(buffer))  # resident in the parent, shared after fork
    start = _address(buffer)
    zygote_maps = pages.mappings()

    def write_touched() -> None:
        for page in TOUCHED:
            buffer[page * pages.PAGE] = 1

    def learner() -> bytes:
        write_touched()
        return pages.learn(zygote_maps).tobytes()

    learned = _ranges_of(_in_fork(learner))
    assert _covered(learned, pages.WRITE, start) == TOUCHED

    def faults_writing(prefault: bool) -> bytes:
        if prefault:
            pages.prefault(learned)
        return str(_faults(write_touched)).encode()

    assert int(_in_fork(lambda: faults_writing(False))) >= len(TOUCHED)
    assert int(_in_fork(lambda: faults_writing(True))) == 0
    buffer.close()


def test_file_pages_read_are_learned_and_mapped_ahead(tmp_path: Path) -> None:
    path = tmp_path / "library.so"
    path.write_bytes(os.urandom(PAGES * pages.PAGE))
    with path.open("rb") as handle:
        mapped = mmap.mmap(handle.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    start = next(m.start for m in pages.mappings() if m.name == str(path))
    zygote_maps = pages.mappings()

    def read_one() -> None:
        assert mapped[37 * pages.PAGE] is not None

    def learner() -> bytes:
        read_one()
        return pages.learn(zygote_maps).tobytes()

    learned = _ranges_of(_in_fork(learner))
    assert 37 in _covered(learned, pages.READ, start)
    assert _covered(learned, pages.WRITE, start) == []

    def faults_reading(prefault: bool) -> bytes:
        if prefault:
            pages.prefault(learned)
        return str(_faults(read_one)).encode()

    assert int(_in_fork(lambda: faults_reading(False))) >= 1
    assert int(_in_fork(lambda: faults_reading(True))) == 0
    mapped.close()


def test_ranges_no_longer_mapped_are_skipped() -> None:
    buffer = mmap.mmap(-1, 4 * pages.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = _address(buffer)
    gone = array("Q", [start, start + 4 * pages.PAGE, pages.WRITE])
    buffer.close()
    assert pages.prefault(gone) == 0


@pytest.mark.parametrize(
    "data",
    [b"\0" * 7, array("Q", [4096, 8192, 5]).tobytes()],
    ids=["truncated", "unknown kind"],
)
def test_a_malformed_ranges_file_is_refused(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "pages.bin"
    path.write_bytes(data)
    assert pages.load(path) is None


def test_saved_ranges_load_back(tmp_path: Path) -> None:
    ranges = array("Q", [4096, 3 * 4096, pages.WRITE, 8 * 4096, 9 * 4096, pages.READ])
    pages.save(tmp_path / "pages.bin", ranges)
    assert pages.load(tmp_path / "pages.bin") == ranges
    assert pages.count(ranges) == {"write": 2, "read": 1}
