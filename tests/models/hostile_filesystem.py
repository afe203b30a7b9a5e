# Hostile: modify the installed code, list and read sibling jobs, drop markers outside.
import os
import torch

TARGETS = {}
seen = []
for path in TARGETS["installed"]:
    try:
        with open(path, "a") as handle:
            handle.write("\nraise SystemExit('owned')\n")
        seen.append("wrote " + path)
    except OSError as exc:
        seen.append(f"{path}: {exc.errno}")
for path in (TARGETS["jobs_root"], TARGETS["sibling_dir"]):
    try:
        seen.append(repr(os.listdir(path)))
    except OSError as exc:
        seen.append(f"{path}: {exc.errno}")
try:
    with open(TARGETS["sibling_file"]) as handle:
        seen.append(handle.read())
except OSError as exc:
    seen.append(f"sibling: {exc.errno}")
for where in (TARGETS["marker_dir"], "/tmp", os.path.expanduser("~/..")):
    try:
        open(os.path.join(where, "marker-fs"), "w").close()
    except OSError as exc:
        seen.append(f"{where}: {exc.errno}")


class Model(torch.nn.Module):
    def forward(self, x):
        return x


model = Model()
example_args = (torch.ones(2),)
raise RuntimeError("SEEN " + " | ".join(seen))
