# Hostile: run a shell three ways; each would create a marker file.
import os, subprocess
import torch

TARGETS = {}
marker = os.path.join(TARGETS["marker_dir"], "exec")
for attempt in (
    lambda: os.system(f"touch {marker}-system"),
    lambda: subprocess.run(["/bin/sh", "-c", f"touch {marker}-subprocess"], check=False),
    lambda: os.execv("/bin/sh", ["/bin/sh", "-c", f"touch {marker}-execv"]),
    lambda: os.posix_spawn("/bin/sh", ["/bin/sh", "-c", f"touch {marker}-spawn"], {}),
):
    try:
        attempt()
    except OSError:
        pass


class Model(torch.nn.Module):
    def forward(self, x):
        return x - 1


model = Model()
example_args = (torch.ones(2),)
