# Hostile: kill the parent (the zygote), everyone (kill -1), the worker; ptrace the parent.
import ctypes, os, signal
import torch

TARGETS = {}
libc = ctypes.CDLL(None, use_errno=True)
for pid in (os.getppid(), TARGETS["worker_pid"], 1):
    libc.syscall(101, 16, pid, 0, 0)  # ptrace(PTRACE_ATTACH... 16 = PTRACE_ATTACH)
    try:
        os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
try:
    os.kill(-1, signal.SIGKILL)
except OSError:
    pass
libc.syscall(62, -1, 9)  # raw kill(-1, SIGKILL)


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
