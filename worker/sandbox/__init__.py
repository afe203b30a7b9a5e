"""Sandboxed, warm execution of uploaded code, by side of the trust line.

```
worker process (not dumpable, has secrets)          host/: SandboxRunner (runner.py),
  │                                                  zygote_client, staging, supervisor,
  │                                                  pipes, outputs, results, job_resources
  └─ bwrap (all namespaces, minimal ro binds)        confinement/bubblewrap.py
       └─ zygote (scrubbed env, torch imported,      zygote/: server (fork server), warmup
          one tiny export run, no thread pool)
            ├─ job child: setsid, closed fds, rlimits, uid,   confinement/lockdown.py,
            │  no_new_privs, Landlock, seccomp → engine       child/run.py
            ├─ loader child (same lockdown): the round trip   zygote/loader.py
            ├─ toolchain child: the broker's templates        zygote/toolchain.py
            └─ spares: a job child and a loader child         zygote/spares.py
```

`host/` never imports torch or the zygote's side (`tests/test_layering.py`); the sides meet
in `protocol.py`, `processes.py` and `settings.py`. docs/sandbox.md ("Shape") says what
each file is for.
"""

import os

from worker.sandbox.confinement.layers import HostLayers, probe
from worker.sandbox.host.runner import SandboxRunner, SandboxUnavailable
from worker.sandbox.settings import (
    LocalFile,
    SandboxJob,
    SandboxResult,
    SandboxSettings,
    SpentFile,
    UploadSource,
    local_settings,
)

__all__ = [
    "HostLayers",
    "LocalFile",
    "SandboxJob",
    "SandboxResult",
    "SandboxRunner",
    "SandboxSettings",
    "SandboxUnavailable",
    "SpentFile",
    "UploadSource",
    "local_settings",
    "probe",
    "run_export_sandboxed",
]


def run_export_sandboxed(
    job: SandboxJob,
    settings: SandboxSettings | None = None,
    **run_kwargs: object,
) -> SandboxResult:
    """Start a runner, run one job, stop the runner (the CLI's one-shot path). Without
    `settings`, a CUDA job gets a GPU runner pinned like this process (`local_settings`)."""
    if settings is None:
        settings = local_settings(job.options, os.environ)
    with SandboxRunner(settings) as runner:
        return runner.run(job, **run_kwargs)  # type: ignore[arg-type]
