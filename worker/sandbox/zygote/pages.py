"""Learn which of the zygote's pages a warm-up touches, and fault them in ahead of a job.

A child forked from the zygote shares its memory copy-on-write: the first write to each
shared page copies it (a page fault), and code pages of torch's libraries, which fork
does not map in the child, fault again on first use. An export in a fresh fork takes
~12,000 such faults more than in a warmed-up child, paid one by one during the job.

The first spare of each kind warms up the slow way (the whole pipeline runs once more)
and then reads its own page map: the anonymous pages it now holds alone (it wrote them)
and the file pages it mapped. Those ranges, relative to the zygote's own mappings, are
the same in every later fork of the zygote. Later spares, and children forked fresh when
no spare is ready, fault them in with two `madvise` calls per range (MADV_POPULATE_WRITE
and MADV_POPULATE_READ, Linux 5.14+): ~50 ms instead of the warm-up's ~750 ms
(`bench/sandbox_overhead.py`, docs/sandbox.md).

Only the zygote's own code runs in a spare before it says ready, so the ranges come
from trusted code; no job child is ever asked.
"""

from __future__ import annotations

import ctypes
import functools
import os
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MADV_POPULATE_READ = 22
MADV_POPULATE_WRITE = 23
PAGE = os.sysconf("SC_PAGE_SIZE")
PRESENT = 1 << 63
FILE_PAGE = 1 << 61
EXCLUSIVE = 1 << 56
WRITE, READ = 1, 0
MAX_RANGES_BYTES = 8 << 20
"""A learned-ranges file larger than this is refused (a few hundred KB is usual)."""


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    name: str


def mappings() -> list[Mapping]:
    """This process's memory mappings (/proc/self/maps)."""
    found = []
    with open("/proc/self/maps") as handle:
        for line in handle:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            name = fields[5].strip() if len(fields) > 5 else ""
            found.append(Mapping(start, end, fields[1], name))
    return found


def learn(zygote_maps: list[Mapping]) -> array:
    """In a child that warmed up: the ranges of the zygote's mappings it touched, as a
    flat array of (start, end, WRITE or READ) triples. WRITE: private pages it now holds
    alone (copied on write); READ: file pages it mapped (fork leaves them unmapped)."""
    ranges = array("Q")
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for mapping in zygote_maps:
            if not _worth_learning(mapping):
                continue
            pagemap.seek(mapping.start // PAGE * 8)
            entries = array("Q", pagemap.read((mapping.end - mapping.start) // PAGE * 8))
            private_writable = "w" in mapping.perms and mapping.perms[3] == "p"
            run_start, run_kind = 0, -1
            for index, entry in enumerate(entries):
                kind = -1
                if entry & PRESENT:
                    if private_writable and entry & EXCLUSIVE and not entry & FILE_PAGE:
                        kind = WRITE
                    elif mapping.name.startswith("/") and entry & FILE_PAGE:
                        kind = READ
                if kind != run_kind:
                    if run_kind >= 0:
                        ranges.extend((run_start, mapping.start + index * PAGE, run_kind))
                    run_start, run_kind = mapping.start + index * PAGE, kind
            if run_kind >= 0:
                ranges.extend((run_start, mapping.end, run_kind))
    return ranges


def _worth_learning(mapping: Mapping) -> bool:
    if not mapping.perms.startswith("r"):
        return False
    if mapping.name.startswith("/dev/") or mapping.name.startswith("[v"):
        return False  # device memory, vdso/vvar/vsyscall: never populated by hand
    return mapping.name in ("", "[heap]") or mapping.name.startswith("/")


def prefault(ranges: array) -> int:
    """Fault the learned ranges in; returns the pages populated. Ranges no longer
    mapped (the zygote freed them since) are skipped."""
    madvise = _madvise()
    pages = 0
    for index in range(0, len(ranges) - 2, 3):
        start, end, kind = ranges[index], ranges[index + 1], ranges[index + 2]
        advice = MADV_POPULATE_WRITE if kind == WRITE else MADV_POPULATE_READ
        if madvise(start, end - start, advice) == 0:
            pages += (end - start) // PAGE
    return pages


def supported() -> bool:
    """Whether this kernel populates ranges on request (Linux 5.14+; not gVisor)."""
    buffer = ctypes.create_string_buffer(PAGE * 2)
    start = (ctypes.addressof(buffer) + PAGE - 1) // PAGE * PAGE
    if _madvise()(start, PAGE, MADV_POPULATE_WRITE) != 0:
        return False
    return os.path.exists("/proc/self/pagemap")


def save(path: Path, ranges: array) -> None:
    path.write_bytes(ranges.tobytes())


def load(path: Path) -> array | None:
    """Ranges saved by `save`; None when missing, too large or malformed."""
    try:
        if path.stat().st_size > MAX_RANGES_BYTES:
            return None
        data = path.read_bytes()
    except OSError:
        return None
    ranges = array("Q")
    if len(data) % (3 * ranges.itemsize):
        return None
    ranges.frombytes(data)
    if any(kind not in (READ, WRITE) for kind in ranges[2::3]):
        return None
    return ranges


def count(ranges: array) -> dict[str, int]:
    """Pages per kind, for the report of the zygote's state."""
    pages = {"write": 0, "read": 0}
    for index in range(0, len(ranges) - 2, 3):
        key = "write" if ranges[index + 2] == WRITE else "read"
        pages[key] += (ranges[index + 1] - ranges[index]) // PAGE
    return pages


@functools.cache
def _madvise() -> Callable[[int, int, int], int]:
    libc = ctypes.CDLL(None, use_errno=True)
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise
