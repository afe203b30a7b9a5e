# Hostile: act on another process of the job's uid (another tenant's job, the worker):
# lower its RLIMIT_CPU, renice it, pin it, watch the data dir with inotify.
import ctypes, errno, json, os, resource, time

import torch

TARGETS = {}  # filled in by tests/sandbox: {"victim_pid": ...}
SLEEP_S = 0.0

libc = ctypes.CDLL(None, use_errno=True)
victim = TARGETS.get("victim_pid", 1)
seen = {"uid": os.getuid()}


class Rlimit(ctypes.Structure):
    _fields_ = [("cur", ctypes.c_ulong), ("max", ctypes.c_ulong)]


def call(name, *args):
    ctypes.set_errno(0)
    result = getattr(libc, name)(*args)
    return 0 if result >= 0 else ctypes.get_errno()


one = Rlimit(1, 1)
seen["prlimit_other"] = call("prlimit", victim, resource.RLIMIT_CPU, ctypes.byref(one), None)
seen["prlimit_self"] = call("prlimit", 0, resource.RLIMIT_NOFILE, None, ctypes.byref(Rlimit()))
seen["setpriority_other"] = call("setpriority", 0, victim, 19)
mask = ctypes.c_ulong(1)
seen["affinity_other"] = call("sched_setaffinity", victim, ctypes.sizeof(mask), ctypes.byref(mask))
seen["inotify"] = call("inotify_init1", 0)
# Its own file (so only the sandbox can refuse): mode, times, extended attributes.
own = os.path.join(os.environ.get("TMPDIR", "/tmp"), "own.txt")
open(own, "w").close()
users_file = TARGETS.get("users_file")  # a file of the worker's user the job cannot read
if users_file is not None:
    try:
        os.chmod(users_file, 0o666)
        seen["chmod_users_file"] = 0
    except OSError as exc:
        seen["chmod_users_file"] = exc.errno
for name, attempt in (
    ("chmod", lambda: os.chmod(own, 0o666)),
    ("utime", lambda: os.utime(own, (0, 0))),
    ("setxattr", lambda: os.setxattr(own, b"user.x", b"1")),
):
    try:
        attempt()
        seen[name] = 0
    except OSError as exc:
        seen[name] = exc.errno
time.sleep(SLEEP_S)  # concurrent jobs overlap here
raise RuntimeError("PROBE" + json.dumps(seen) + "PROBE")
