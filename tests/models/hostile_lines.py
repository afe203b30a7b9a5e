# Hostile: lines meant to crash the processes that read them. MODE picks one:
#   "deep_request": a round-trip request nested 6,000 deep (RecursionError in a plain parser)
#   "infinite_threads": {"threads": Infinity} (OverflowError in int())
#   "deep_progress": a progress line nested 8,000 deep, then 1 MiB more on the pipe
#   "answer_flood": 8,000 round-trip requests (drops), none of whose answers it reads
import os

import torch

MODE = "deep_request"
TARGETS = {}

if MODE == "deep_request":
    os.write(4, b"[" * 6000 + b"]" * 6000 + b"\n")
elif MODE == "infinite_threads":
    os.write(4, b'{"pt2": "program.pt2", "threads": Infinity}\n')
elif MODE == "answer_flood":
    import time

    os.write(4, b'{"drop": true}\n' * 8000)
    time.sleep(120)  # the answers pile up unread
elif MODE == "deep_progress":
    os.write(3, b'{"progress": ' + b"[" * 8000 + b"]" * 8000 + b"}\n")
    for _ in range(64):  # more than a pipe holds: blocks forever if nobody reads
        os.write(3, b'{"x": "' + b"y" * 16000 + b'"}\n')


class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1


model = Model()
example_args = (torch.ones(2),)
