"""The seccomp filter installed in every job child, built with pyseccomp (libseccomp).

A deny list on top of Landlock, rlimits and (where available) bubblewrap: the calls
below fail with EPERM (so do `prlimit64` and `sched_setaffinity` on any process but
the job's own, and signals to any process but its own), except `clone3`, which fails
with ENOSYS so that glibc falls back to `clone`, where thread creation (CLONE_THREAD)
stays allowed and process creation does not (nor, for any process, a new namespace:
`CLONE_NAMESPACES`). Other architectures' system calls (e.g.
i386 through `int 0x80`) kill the process (libseccomp's bad-arch action). A CUDA job on
a GPU worker may also call `memfd_create`, and make and listen on the one kind of socket
the NVIDIA driver makes (`GPU_ALLOWED`, `GPU_SOCKET`); nothing else differs.

`pyseccomp` locates libseccomp with `ctypes.util.find_library`, which spawns
helper processes: import it (`prepare()`) before the child is locked down.
"""

from __future__ import annotations

import errno
from types import ModuleType

CLONE_THREAD = 0x00010000
CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
"""`clone` flags that make a new namespace: refused to every process of every job (a
child in a new user namespace holds every capability there; `unshare` and `setns` are on
the deny list, and `clone3`, whose flags seccomp cannot read, answers ENOSYS)."""

DENIED: tuple[str, ...] = (
    # network and local sockets
    "socket",
    "socketpair",
    "connect",
    "bind",
    "listen",
    "accept",
    "accept4",
    # new programs and processes
    "execve",
    "execveat",
    "fork",
    "vfork",
    # other processes' memory and control
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "process_madvise",
    "kcmp",
    "pidfd_open",
    "pidfd_getfd",
    "pidfd_send_signal",
    "tkill",
    "process_mrelease",
    "setpriority",
    "ioprio_set",
    "sched_setscheduler",
    "sched_setparam",
    "sched_setattr",
    "migrate_pages",
    "move_pages",
    # file modes, owners, times and extended attributes: Landlock does not cover them, and
    # a job of a non-root worker shares its uid with the user's own files (a job chmod'ed
    # the user's 0600 file to 0666). No export step calls them (checked with strace).
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "setxattr",
    "lsetxattr",
    "fsetxattr",
    "removexattr",
    "lremovexattr",
    "fremovexattr",
    # watching files (another tenant's job ids and hashes in a data dir's names)
    "inotify_init",
    "inotify_init1",
    "inotify_add_watch",
    # escaping the session and process group
    "setsid",
    "setpgid",
    # state that outlives the job
    "shmget",
    "shmat",
    "shmctl",
    "msgget",
    "semget",
    "memfd_create",
    "memfd_secret",
    "mq_open",
    "mq_unlink",
    "mq_timedsend",
    "mq_timedreceive",
    "mq_notify",
    "mq_getsetattr",
    # namespaces, mounts, kernel interfaces
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "unshare",
    "setns",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsmount",
    "fspick",
    "fsconfig",
    "mount_setattr",
    "bpf",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "userfaultfd",
    "perf_event_open",
    "open_by_handle_at",
    "name_to_handle_at",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "fanotify_init",
    "syslog",
    "personality",
    "setuid",
    "setgid",
    "setreuid",
    "setregid",
    "setresuid",
    "setresgid",
    "setgroups",
    "setfsuid",
    "setfsgid",
    "capset",
)


def prepare() -> ModuleType:
    """Import pyseccomp (and libseccomp) now, while helper processes may still run."""
    import pyseccomp

    pyseccomp.SyscallFilter(pyseccomp.ALLOW)  # loads libseccomp and resolves symbols
    return pyseccomp


GPU_ALLOWED: tuple[str, ...] = ("memfd_create", "socket", "bind", "listen")
"""Taken off the deny list for CUDA jobs only: the NVIDIA driver creates memfds while
it initializes (CUDA error 304, "OS call failed", without them). A memfd cannot outlive
the job here: it dies with the process's fds and mappings, no socket can pass it on,
exec is denied, RLIMIT_FSIZE caps its size and the RSS watchdog counts its pages.

The driver also listens on a socket of its own while it initializes (measured on an
H100, driver 580, CUDA 13: an abstract `@cuda-uvmfd-<netns>-<pid>@`, `SOCK_SEQPACKET`;
error 304 again without it). `socket` is allowed for that domain and type only
(`GPU_SOCKET`), `bind` and `listen` for it: `connect`, `accept`, `socketpair` and every
other kind of socket stay denied, so nothing reaches or leaves the job through it."""

GPU_SOCKET = (1, 5)
"""The one socket a CUDA job may make: (`AF_UNIX`, `SOCK_SEQPACKET`)."""
SOCK_TYPE_MASK = 0xF
"""The type bits of `socket`'s second argument (the rest are SOCK_CLOEXEC, SOCK_NONBLOCK)."""


EXEC_ALLOWED: tuple[str, ...] = ("execve", "execveat", "fork", "vfork")
"""Taken off the deny list for a toolchain child (toolchain.py: the zygote's child that
runs a target's compiler or flatc for a job, never uploaded code): Landlock then limits
execution to those files (`Confinement.executables`), and what they start inherits this
filter (no sockets, no namespaces), Landlock (no writes outside the job's directories),
the rlimits and the job's cgroups."""


MODE_CALLS: tuple[str, ...] = ("chmod", "fchmod", "fchmodat", "fchmodat2")
"""File mode changes: refused to every job (EPERM); for a job converting to `aoti` or
`executorch`, and its toolchain children, they answer success without changing
anything."""


def denied(gpu: bool = False, exec_programs: bool = False) -> tuple[str, ...]:
    """The system calls that fail with EPERM in a job child (a CUDA job's when `gpu`;
    one that may run the converters' programs when `exec_programs`)."""
    allowed = (GPU_ALLOWED if gpu else ()) + (EXEC_ALLOWED if exec_programs else ())
    return tuple(name for name in DENIED if name not in allowed)


def install(
    own_pid: int, gpu: bool = False, exec_programs: bool = False, inert_mode_calls: bool = False
) -> list[str]:
    """Load the filter into this process; returns the system calls it could not name.

    Signals (`kill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo`) are allowed
    only towards `own_pid` (a program it starts inherits the rule with the job's pid:
    it cannot signal anyone else, not even itself). `gpu` allows what the CUDA driver needs
    (`GPU_ALLOWED`; sockets of `GPU_SOCKET`'s kind only); `exec_programs` allows execve
    and process creation (`EXEC_ALLOWED`); `inert_mode_calls` answers `MODE_CALLS` with
    success and no effect. Namespaces are refused to all. Raises OSError when the kernel
    refuses the filter; the caller must then refuse the job.
    """
    seccomp = prepare()
    flt = seccomp.SyscallFilter(seccomp.ALLOW)
    deny = seccomp.ERRNO(errno.EPERM)
    unknown: list[str] = []
    for name in denied(gpu, exec_programs):
        # Converting, the compiler's toolchain and torch's inductor chmod what they write
        # (a cache entry's metadata): the call answers success and changes nothing.
        action = seccomp.ERRNO(0) if inert_mode_calls and name in MODE_CALLS else deny
        try:
            flt.add_rule(action, name)
        except (ValueError, OSError, RuntimeError):
            unknown.append(name)
    if gpu:  # only the driver's socket: every other domain and type, denied
        domain, kind = GPU_SOCKET
        flt.add_rule(deny, "socket", seccomp.Arg(0, seccomp.NE, domain))
        for other in range(SOCK_TYPE_MASK + 1):
            if other != kind:
                flt.add_rule(
                    deny, "socket", seccomp.Arg(1, seccomp.MASKED_EQ, SOCK_TYPE_MASK, other)
                )
    flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    if not exec_programs:
        flt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, CLONE_THREAD, 0))
    for flag in CLONE_NAMESPACES.values():
        flt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    for name in ("kill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo"):
        flt.add_rule(deny, name, seccomp.Arg(0, seccomp.NE, own_pid))
    # Limits and CPU placement: of this process only (pid 0 or its own). Another job's
    # RLIMIT_CPU set to 1 s killed it; the worker's, lowered, crash-looped new workers.
    # libseccomp compares an argument once per rule, so "neither 0 nor own_pid" is one
    # rule for pids above it and one per aligned block of [1, own_pid - 1].
    for name in ("prlimit64", "sched_setaffinity"):
        flt.add_rule(deny, name, seccomp.Arg(0, seccomp.GT, own_pid))
        for value, size in aligned_blocks(1, own_pid - 1):
            mask = ~(size - 1) & 0xFFFF_FFFF_FFFF_FFFF
            flt.add_rule(deny, name, seccomp.Arg(0, seccomp.MASKED_EQ, mask, value))
    flt.load()
    return unknown


def aligned_blocks(low: int, high: int) -> list[tuple[int, int]]:
    """[low, high] as blocks `value .. value + size - 1` with size a power of two and
    value a multiple of it (each one masked comparison); at most ~2 log2(high) blocks."""
    blocks = []
    while low <= high:
        size = low & -low if low else 1 << 62
        while size > high - low + 1:
            size >>= 1
        blocks.append((low, size))
        low += size
    return blocks
