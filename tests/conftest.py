"""Settings every test process shares.

Workers started by the tests (in this process or as `torchport serve` / `worker`
subprocesses, which inherit the environment) warm no model library: each one would spend
~20 s importing transformers, diffusers and peft twice (probe and zygote) before its first
job, and most of these tests start a worker of their own. The sandbox's own arenas
(tests/sandbox/conftest.py) and the model suite build `SandboxSettings` directly, so they
keep the default and the hostile and warm-library tests run against a warm zygote.
"""

from __future__ import annotations

import os

os.environ.setdefault("TORCHPORT_SANDBOX_WARM_LIBRARIES", "[]")
