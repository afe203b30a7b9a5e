"""The zygote's own view of the file system, for a root worker without bubblewrap.

Jobs run as an unprivileged uid. When the interpreter, the standard library or the
installed packages sit under a directory that uid cannot traverse (pyenv in root's
0700 home, a virtualenv in a private directory), every module the zygote did not
import beforehand fails to import in a job (`import transformers` → "No module named
'http.cookiejar'"; opening a zip → "unknown encoding: cp437").

Bubblewrap solves this by building the job's root from binds with 0755 parents. Without
it, the zygote (still root) does the same for just those directories: in a mount
namespace of its own, each blocking directory is covered by a small tmpfs (mode 0755)
into which the paths jobs need are bound back, code read-only and the jobs' staging
root read-write. Everything else under that directory (root's home: keys, shell
history, the service's database) disappears from the zygote's and the jobs' view. The
host's mounts are untouched: the namespace's mounts are private.

`unreadable()` is the check that follows, run as the job uid: every `sys.path` entry of
the zygote must be listable, or the zygote refuses to start and names the path.
"""

from __future__ import annotations

import ctypes
import os
import stat
from collections.abc import Iterable
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18


class ViewError(OSError):
    """The view could not be built (no CAP_SYS_ADMIN, a seccomp profile forbids mounts)."""


def traversable(path: Path, uid: int, gid: int) -> bool:
    """Whether `uid`/`gid` (no supplementary groups) may search directory `path`."""
    try:
        st = path.stat()
    except OSError:
        return False
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def blocking(paths: Iterable[Path], uid: int, gid: int) -> list[Path]:
    """The outermost ancestors of `paths` that `uid` cannot traverse, shallowest first.

    Only ancestors: a path that is itself unreadable stays so through any bind, and
    `unreadable()` reports it.
    """
    found: set[Path] = set()
    for path in paths:
        for parent in reversed(path.parents):  # "/" first
            if any(parent.is_relative_to(b) for b in found):
                break
            if parent != Path("/") and not traversable(parent, uid, gid):
                found.add(parent)
                break
    return sorted(found, key=lambda p: (len(p.parts), str(p)))


def build(code: Iterable[Path], writable: Iterable[Path], uid: int, gid: int) -> list[str]:
    """Enter a private mount namespace in which `code` (read-only) and `writable` are
    reachable by `uid`; returns the directories covered (empty: nothing was needed, and
    no namespace was made). Must run as root, before any thread starts."""
    code = [p.resolve() for p in code if p.exists()]
    writable = [p.resolve() for p in writable if p.exists()]
    tops = blocking([*code, *writable], uid, gid)
    if not tops:
        return []
    libc = ctypes.CDLL(None, use_errno=True)

    def call(result: int, what: str) -> None:
        if result != 0:
            err = ctypes.get_errno()
            raise ViewError(err, f"{what}: {os.strerror(err)}")

    call(libc.unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    call(libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /")
    old_umask = os.umask(0o022)
    try:
        for top in tops:
            inside = [(p, True) for p in _outermost(code) if p.is_relative_to(top)]
            inside += [(p, False) for p in _outermost(writable) if p.is_relative_to(top)]
            # Held open across the covering mount: binds are made from these.
            fds = [(path, ro, os.open(path, os.O_PATH | os.O_CLOEXEC)) for path, ro in inside]
            try:
                call(
                    libc.mount(
                        b"tmpfs",
                        os.fsencode(top),
                        b"tmpfs",
                        MS_NOSUID | MS_NODEV,
                        b"mode=0755,size=1m",
                    ),
                    f"mount tmpfs on {top}",
                )
                for path, read_only, fd in fds:
                    if os.path.isdir(f"/proc/self/fd/{fd}"):
                        path.mkdir(parents=True, exist_ok=True)
                    else:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.touch(exist_ok=True)
                    target = os.fsencode(path)
                    source = f"/proc/self/fd/{fd}".encode()
                    call(libc.mount(source, target, None, MS_BIND | MS_REC, None), f"bind {path}")
                    if read_only:
                        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
                        call(libc.mount(None, target, None, flags, None), f"read-only {path}")
            finally:
                for _, _, fd in fds:
                    os.close(fd)
    finally:
        os.umask(old_umask)
    return [str(t) for t in tops]


def unreadable(paths: Iterable[str], uid: int, gid: int) -> list[str]:
    """The entries of `paths` that `uid`/`gid` cannot list, checked in a forked child
    that drops to them (root only; before threads start)."""
    candidates = [p for p in paths if p and os.path.isdir(p)]
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 0
        try:
            os.close(read_fd)
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)
            bad = []
            for path in candidates:
                try:
                    os.listdir(path)
                except OSError as exc:
                    bad.append(f"{path} ({exc.strerror})")
            os.write(write_fd, "\n".join(bad).encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as handle:
        data = handle.read()
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        return [f"(the check as uid {uid} failed)"]
    return [line for line in data.decode().splitlines() if line]


def _outermost(paths: list[Path]) -> list[Path]:
    kept: list[Path] = []
    for path in sorted(set(paths), key=lambda p: len(p.parts)):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept
