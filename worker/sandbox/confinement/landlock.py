"""Landlock, through its three system calls (ctypes, no extra package).

The `landlock` package on PyPI speaks only ABI 1 (filesystem rights); here the
ruleset also covers what later ABIs add where the kernel has them: truncate (3),
TCP bind/connect (4), device ioctls (5), and the abstract-Unix-socket and
signal scopes (6).
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import stat
from collections.abc import Iterable
from pathlib import Path

_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}

_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15

NET_BIND_TCP = 1 << 0
NET_CONNECT_TCP = 1 << 1

SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

READ = FS_READ_FILE | FS_READ_DIR
WRITE = (
    READ
    | FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SYM
    | FS_TRUNCATE
    | FS_REFER
)
"""A job's own directories: read, write, and move files between them (`FS_REFER`: a
rename or link across directories, which libraries use to put a file written beside
its destination in place, e.g. onnx_ir's external data). Landlock allows a move only
when both directories grant REFER and the destination grants no right the source
lacks, so nothing moves into or out of a read-only path."""
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


class LandlockError(OSError):
    """The kernel refused a Landlock call."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _numbers() -> tuple[int, int, int] | None:
    return _SYSCALLS.get(platform.machine())


def abi_version() -> int:
    """The Landlock ABI the kernel offers; 0 when it has none (or it is disabled)."""
    return probe()[0]


def probe() -> tuple[int, int]:
    """(ABI, 0), or (0, errno) when there is none: ENOSYS where the kernel lacks the
    system calls (and under gVisor), EOPNOTSUPP where Landlock is built but disabled."""
    numbers = _numbers()
    if numbers is None:
        return 0, errno.ENOSYS
    version = _libc.syscall(numbers[0], None, ctypes.c_size_t(0), _CREATE_RULESET_VERSION)
    if version < 0:
        return 0, ctypes.get_errno()
    return int(version), 0


def _handled_fs(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def restrict(
    read: Iterable[Path],
    write: Iterable[Path],
    devices: Iterable[Path] = (),
    ioctl_devices: Iterable[Path] = (),
    executables: Iterable[Path] = (),
) -> int:
    """Confine this thread (and what it later creates) to the given paths.

    `read` paths may be read, `write` paths read and written, `devices` (e.g.
    /dev/null) read and written as files, `ioctl_devices` (a GPU's nodes) also
    listed and ioctl'd (ABI 5+; below it the kernel does not restrict device
    ioctls at all), `executables` (single files) executed: nothing else may be
    (FS_EXECUTE is handled and granted only there). Files move across directories
    (FS_REFER, ABI 2+) only within the `write` paths. Everything else in the filesystem is
    denied; on ABI 4+ TCP bind/connect are denied, on ABI 6+ abstract Unix
    sockets and signals to processes outside the domain. Paths that do not exist
    are skipped. Needs `PR_SET_NO_NEW_PRIVS` first. Returns the ABI used.
    """
    numbers = _numbers()
    abi = abi_version()
    if numbers is None or abi < 1:
        raise LandlockError(38, "Landlock is not available on this kernel")
    create, add_rule, restrict_self = numbers
    handled = _handled_fs(abi)
    attr = _RulesetAttr(handled_access_fs=handled)
    size = 8
    if abi >= 4:
        attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP
        size = 16
    if abi >= 6:
        attr.scoped = SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        size = 24
    ruleset = _libc.syscall(create, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise LandlockError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        rules = [(path, READ) for path in read]
        rules += [(path, WRITE) for path in write]
        rules += [(path, FS_READ_FILE | FS_WRITE_FILE) for path in devices]
        rules += [(path, READ | FS_WRITE_FILE | FS_IOCTL_DEV) for path in ioctl_devices]
        # Each one file (a compiler, its helpers, the dynamic loader): executed, read.
        rules += [(path, FS_EXECUTE | FS_READ_FILE) for path in executables]
        for path, rights in rules:
            _add_path_rule(add_rule, ruleset, path, rights & handled)
        if _libc.syscall(restrict_self, ruleset, 0) != 0:
            raise LandlockError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _add_path_rule(add_rule: int, ruleset: int, path: Path, rights: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            rights &= _FILE_RIGHTS  # rules on files may only carry file rights
        beneath = _PathBeneathAttr(allowed_access=rights, parent_fd=fd)
        if _libc.syscall(add_rule, ruleset, _RULE_PATH_BENEATH, ctypes.byref(beneath), 0) != 0:
            raise LandlockError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)
