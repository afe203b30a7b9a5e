# Hostile: a fork bomb, then a fork + setsid daemon that would write a marker later.
import os, time
import torch

TARGETS = {}
pids = []
for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        try:
            os.setsid()
        except OSError:
            pass
        time.sleep(2)
        open(os.path.join(TARGETS["marker_dir"], f"daemon-{os.getpid()}"), "w").close()
        os._exit(0)
    pids.append(pid)


class Model(torch.nn.Module):
    def forward(self, x):
        return x + 2


model = Model()
example_args = (torch.ones(2),)
