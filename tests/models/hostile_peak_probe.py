# Not hostile: a probe of its own process, run by the sandbox tests like the hostile
# models. While its loading stage runs (the stage's peak-memory watch started) it says
# whether it can reset its high-water mark and which threads it has, then sleeps, so
# that a test can look at the zygote's children while it is still loading.
import sys
import threading
import time

import torch

from engine.profile import resident_memory

threads = sorted(thread.name for thread in threading.enumerate())
print(f"PEAK-RESET={resident_memory.reset_peak()} THREADS={threads}", file=sys.stderr)
time.sleep(2.0)


model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
example_args = (torch.randn(2, 4),)
