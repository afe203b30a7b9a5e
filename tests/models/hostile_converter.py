"""Hostile upload for a job that asked for the `aoti` and `executorch` targets: its child
may execute the C++ compiler and flatc. At import it tries what that profile must still
refuse, with a positive control (g++ itself runs). Everything contained: the module
defines a model and the job succeeds; anything that got through fails the import with
ESCAPED and what did.
"""

import os
import socket
import subprocess
import sys
import tempfile

import torch

outcome = {}


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


scratch = tempfile.mkdtemp()
source = os.path.join(scratch, "hello.c")
binary = os.path.join(scratch, "hello")
with open(source, "w") as handle:
    handle.write("int main(void) { return 0; }\n")

attempt("control_compiler_runs", lambda: run(["g++", "--version"]))
attempt("compile", lambda: run(["g++", "-x", "c", source, "-o", binary]))
attempt("run_compiled", lambda: run([binary]))
attempt("shell", lambda: run(["/bin/sh", "-c", "true"]))
attempt("python", lambda: run([sys.executable, "-c", "pass"]))
attempt("socket", lambda: socket.socket().close())
attempt("write_outside", lambda: open("/tmp/torchport-escaped", "w").close())

EXPECTED = {
    "control_compiler_runs": "done",
    "compile": "done",  # writing its output in scratch is allowed; running it is not
    "run_compiled": "PermissionError",
    "shell": "PermissionError",
    "python": "PermissionError",
    "socket": "PermissionError",
    "write_outside": "PermissionError",
}
if outcome != EXPECTED:
    raise RuntimeError(f"ESCAPED or broken: {outcome}")


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))


model = Small()
example_args = (torch.randn(2, 8),)
