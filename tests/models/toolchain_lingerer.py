"""Upload for the toolchain-leftover tests (tests/sandbox/test_toolchain_escape.py): it has
the broker run its compiler once, where the test made that "compiler" a program that
leaves a child behind (the way a program of the job's choosing would have)."""

import subprocess

import torch

completed = subprocess.run(["g++", "--version"], capture_output=True, timeout=120)
if completed.returncode != 0:
    raise RuntimeError(f"the toolchain did not run: {completed.returncode}")

model = torch.nn.Linear(4, 2)
example_args = (torch.randn(1, 4),)
