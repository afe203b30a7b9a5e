# Hostile: park as many threads as the kernel gives (RLIMIT_NPROC counts per uid, so on
# a shared uid this stopped every other job from starting one), then report the count.
import json, threading

import torch

threading.stack_size(64 << 10)  # small stacks: the memory limit must not stop it first
stop = threading.Event()
started = 0
try:
    for _ in range(20000):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
stop.set()
raise RuntimeError("PROBE" + json.dumps({"threads": started}) + "PROBE")
