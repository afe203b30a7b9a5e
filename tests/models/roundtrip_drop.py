# Speaks the round-trip protocol by hand at import (fd 4 out, fd 5 back): a drop with no
# loader, a loader of a program of its own dropped while it loads, and a drop after an
# answer (a second loader asked for while one runs is refused at once). The answers are
# checked here; the pipeline's own round trip follows.
import json
import os
import tempfile

import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2 + 1


def _answers_until_dropped() -> list:
    buffer = b""
    while b'"dropped": true' not in buffer:
        chunk = os.read(5, 4096)
        if not chunk:
            raise SystemExit("the zygote closed the answer pipe")
        buffer += chunk
    return [json.loads(line) for line in buffer.splitlines() if line.strip()]


DROP_ANSWERS = []
os.write(4, b'{"drop": true}\n')
DROP_ANSWERS += _answers_until_dropped()
program = os.path.join(tempfile.gettempdir(), "dropped.pt2")
torch.export.save(torch.export.export(Model(), (torch.ones(2),)), program)
os.write(4, (json.dumps({"pt2": program, "threads": 1}) + "\n").encode())
os.write(4, b'{"drop": true}\n')
DROP_ANSWERS += _answers_until_dropped()
if DROP_ANSWERS != [{"dropped": True}, {"dropped": True}]:
    raise RuntimeError(f"unexpected answers: {DROP_ANSWERS}")
os.write(4, (json.dumps({"pt2": program, "threads": 1}) + "\n").encode())
os.write(4, (json.dumps({"pt2": program, "threads": 1}) + "\n").encode())  # refused at once
os.write(4, b'{"drop": true}\n')
late = _answers_until_dropped()
if [a.get("reason") for a in late] != ["too many round-trip requests", None]:
    raise RuntimeError(f"unexpected answers: {late}")

model = Model()
example_args = (torch.ones(2),)
