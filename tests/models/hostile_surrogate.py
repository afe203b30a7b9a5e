# Text UTF-8 cannot encode: a lone surrogate ("\udc80") in the user's own exception
# message, in what it prints, and (written on the sandbox's progress pipe, fd 3) as a
# JSON escape in a progress line and a refusal. MODE picks where; the test also runs each
# mode with BAD = "x" to see what the job gives without the surrogate.
import os
import sys

import torch

MODE = "import"
BAD = "\udc80"

if MODE == "import":
    raise ValueError(f"bad {BAD} value")
if MODE == "lines":
    escaped = BAD.encode("ascii", "backslashreplace").replace(b"\\x", b"\\u00")
    for line in (
        b'{"progress": {"stage": "loading", "fraction": 0.5, "message": "bad %s value"}}',
        b'{"refused": "sandbox_violation", "message": "bad %s value"}',
    ):
        os.write(3, line % escaped + b"\n")


class Model(torch.nn.Module):
    def forward(self, x):
        if MODE == "forward":
            print(f"printed {BAD} text", flush=True)
            print(f"stderr {BAD} text", file=sys.stderr, flush=True)
            raise ValueError(f"bad {BAD} value")
        return x + 1


model = Model()
example_args = (torch.ones(2),)
