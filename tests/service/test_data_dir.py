"""The data directory (database, broker messages, artifact store) is closed to every other
uid: a job's uid cannot list it, stat inside it or watch it (issue: a job without
bubblewrap saw another tenant's job ids and hashes there)."""

from __future__ import annotations

import os
import stat

from service.app import build_state
from service.settings import ServiceSettings

JOB_UID = 65534


def test_the_data_dir_is_private(settings: ServiceSettings) -> None:
    settings.data_dir.mkdir(parents=True)
    os.chmod(settings.data_dir, 0o755)  # as an older version left it
    (settings.data_dir / "artifacts").mkdir()
    state = build_state(settings)
    state.engine.dispose()
    assert stat.S_IMODE(settings.data_dir.stat().st_mode) == 0o700
    if os.geteuid() != 0:
        return
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        code = 1
        try:
            os.setgroups([])
            os.setgid(JOB_UID)
            os.setuid(JOB_UID)
            try:
                os.stat(settings.data_dir / "artifacts")
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
