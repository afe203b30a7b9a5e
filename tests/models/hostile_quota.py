# Hostile: take more disk than the job's quota, in one of several ways (MODE), then hold
# it for a while so the worker's checks see it while the job runs.
import os, tempfile, time

import torch

MODE = "many_files"
CHUNK = b"\1" * (1 << 20)
scratch = tempfile.gettempdir()
held = []


def write(handle, megabytes):
    for _ in range(megabytes):
        handle.write(CHUNK)
    handle.flush()


if MODE == "many_files":  # inodes: empty files cost no blocks
    for index in range(100_000):
        open(os.path.join(scratch, f"f{index}"), "wb").close()
elif MODE == "big_files":  # 5 files, each under RLIMIT_FSIZE, together over the quota
    for index in range(5):
        with open(os.path.join(scratch, f"big{index}"), "wb") as handle:
            write(handle, 30)
elif MODE == "unlinked":  # deleted at once, kept open: invisible to a directory walk
    for index in range(5):
        path = os.path.join(scratch, f"gone{index}")
        handle = open(path, "wb")
        os.unlink(path)
        write(handle, 30)
        held.append(handle)
elif MODE == "one_big_file":  # one file over RLIMIT_FSIZE
    with open(os.path.join(scratch, "huge"), "wb") as handle:
        write(handle, 40)
elif MODE == "left_behind":  # over the quota, then done before a check can run
    with open(os.path.join(scratch, "left"), "wb") as handle:
        write(handle, 30)
    with open(os.path.join(scratch, "left2"), "wb") as handle:
        write(handle, 30)
    with open(os.path.join(scratch, "left3"), "wb") as handle:
        write(handle, 30)
if MODE in ("many_files", "big_files", "unlinked"):
    time.sleep(20)


class Model(torch.nn.Module):
    def forward(self, x):
        return x + 1


model = Model()
example_args = (torch.ones(2),)
