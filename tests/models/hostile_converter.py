"""Hostile upload for a job that asked for the `aoti` (and maybe `executorch`) target. Its
own code keeps the strict profile whatever the targets: no exec, no fork, no namespaces,
not even through the dynamic loader. What it may do beyond a job without targets is ask
the zygote's toolchain broker for the templates' commands on its own files (the control:
`g++ --version` and an object compiled into its scratch); every way of bending the
toolchain into running something else is refused. Everything contained: the module defines a model and
the job succeeds; anything that got through fails the import with ESCAPED and what did.
"""

import ctypes
import os
import socket
import subprocess
import sys
import tempfile

import torch
from worker.sandbox.zygote.relay import TOOLCHAIN
from worker.sandbox.child.requests import channel

outcome = {}
scratch = tempfile.mkdtemp()
marker = os.path.join(scratch, "escaped")
source = os.path.join(scratch, "hello.cpp")
binary = os.path.join(scratch, "hello.o")
with open(source, "w") as handle:
    handle.write("int main() { return 0; }\n")
responses = os.path.join(scratch, "flags.rsp")
with open(responses, "w") as handle:
    handle.write(f"-wrapper /bin/sh,-c,touch\\ {marker}\n")
LOADER = next(
    p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if os.path.exists(p)
)
CLONE_NEW = 0x10000000 | 0x20000000 | 0x40000000 | 0x00020000 | 0x04000000  # user pid net ns uts
SIGCHLD = 17
libc = ctypes.CDLL(None, use_errno=True)


def attempt(name, action):
    try:
        action()
        outcome[name] = "done"
    except OSError as exc:
        outcome[name] = type(exc).__name__


def run(argv):
    completed = subprocess.run(argv, capture_output=True, timeout=60)
    if completed.returncode != 0:
        raise OSError(f"exit {completed.returncode}: {completed.stderr[-200:]!r}")


def compile_object():
    """The broker's template for one object, asked for on the request pipe."""
    request = {"run": "gcc", "kind": "object", "inputs": [source], "output": binary}
    request.update(opt="O3", march="x86-64", isa="none")
    link = channel()
    link.send(request, prefix=TOOLCHAIN)
    reply = link.receive("toolchain") or {}
    if reply.get("rc") != 0 or not os.path.exists(binary):
        raise OSError(f"not compiled: {reply}")


def spawn(argv):
    os.posix_spawn(argv[0], argv, {})


def fork():
    if os.fork() == 0:
        os._exit(0)


def clone_namespaces():
    if libc.syscall(56, CLONE_NEW | SIGCHLD, 0, 0, 0, 0) == -1:  # SYS_clone on x86_64
        raise OSError(ctypes.get_errno(), "clone refused")
    os._exit(0)  # only reached in a child that should not exist


attempt("control_compiler_runs", lambda: run(["g++", "--version"]))
attempt("compile", compile_object)
attempt("run_compiled", lambda: run([binary]))
attempt("shell", lambda: run(["/bin/sh", "-c", f"touch {marker}"]))
attempt("python", lambda: run([sys.executable, "-c", "pass"]))
attempt("loader_shell", lambda: run([LOADER, "/bin/sh", "-c", f"touch {marker}"]))
attempt("spawn_compiler", lambda: spawn(["/usr/bin/g++", "--version"]))
attempt("spawn_loader", lambda: spawn([LOADER, "/bin/sh", "-c", f"touch {marker}"]))
attempt("fork", fork)
attempt("clone_namespaces", clone_namespaces)
attempt("wrapper", lambda: run(["g++", "-wrapper", f"/bin/sh,-c,touch {marker}", source]))
attempt("plugin", lambda: run(["g++", f"-fplugin={binary}", "-c", source, "-o", binary]))
attempt("prefix", lambda: run(["g++", "-B", scratch, "-c", source, "-o", binary]))
attempt("response_file", lambda: run(["g++", "@" + responses, source, "-o", binary]))
attempt("linker_flags", lambda: run(["g++", f"-Wl,-plugin,{binary}", source, "-o", binary]))
attempt("output_outside", lambda: run(["g++", "-c", source, "-o", "/tmp/escaped.o"]))
attempt("socket", lambda: socket.socket().close())
attempt("write_outside", lambda: open("/tmp/torchport-escaped", "w").close())

EXPECTED = {
    "control_compiler_runs": "done",
    "compile": "done",  # the broker compiles the job's own file into its scratch
    **{
        name: "PermissionError"
        for name in (
            "run_compiled",
            "shell",
            "python",
            "loader_shell",
            "spawn_compiler",
            "spawn_loader",
            "fork",
            "clone_namespaces",
            "wrapper",
            "plugin",
            "prefix",
            "response_file",
            "linker_flags",
            "output_outside",
            "socket",
            "write_outside",
        )
    },
}
if outcome != EXPECTED or os.path.exists(marker):
    raise RuntimeError(f"ESCAPED or broken: {outcome}, marker: {os.path.exists(marker)}")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


model = Small()
example_args = (torch.randn(2, 8),)
