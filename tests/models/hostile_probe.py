# Reports what the job can see, so tests can check each layer by its effect.
import json, os, resource, socket
import torch

TARGETS = {}
seen = {"uid": os.getuid(), "nproc": resource.getrlimit(resource.RLIMIT_NPROC)[0]}
try:
    socket.socket()
    seen["socket"] = "ok"
except OSError as exc:
    seen["socket"] = exc.errno
try:
    with open(TARGETS["readable_outside"]) as handle:
        seen["outside_read"] = handle.read()[:20]
except OSError as exc:
    seen["outside_read"] = exc.errno
seen["etc_exists"] = os.path.exists("/etc/passwd")
try:
    seen["net"] = sorted(os.listdir("/sys/class/net"))
except OSError as exc:
    seen["net"] = exc.errno
seen["pid"] = os.getpid()
seen["ppid"] = os.getppid()


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
raise RuntimeError("PROBE" + json.dumps(seen) + "PROBE")
