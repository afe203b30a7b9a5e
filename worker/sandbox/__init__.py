"""Sandboxed, warm execution of uploaded code.

```
worker process (not dumpable, has secrets)          SandboxRunner (runner.py): zygote_client.py,
  │                                                  staging.py, supervisor.py, pipes.py,
  │                                                  outputs.py, results.py, processes.py
  └─ bwrap (all namespaces, minimal ro binds)        bubblewrap.py, when the host allows it
       └─ zygote (scrubbed env, torch imported,      zygote.py (fork server), warmup.py
          one tiny export run, no thread pool)
            ├─ job child: setsid, closed fds, rlimits, uid 65534,       lockdown.py
            │  no_new_privs, Landlock, seccomp → engine.pipeline         child.py
            ├─ loader child (same lockdown): torch.export.load + run,   loader.py
            │  asked for by the job child through the zygote            (round trip)
            └─ spares: a job child and a loader child warmed while idle  spares.py
```

docs/sandbox.md ("Shape") says what each file is for.
"""

import os

from worker.sandbox.layers import HostLayers, probe
from worker.sandbox.runner import SandboxRunner, SandboxUnavailable
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
