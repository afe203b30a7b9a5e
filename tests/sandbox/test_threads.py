"""The zygote starts where libraries that start threads are installed, and names a thread
it cannot stop (worker/sandbox/zygote/threads.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest

from worker.sandbox.zygote import threads


def _run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def test_tqdm_starts_its_monitor_thread_unless_quieted() -> None:
    pytest.importorskip("tqdm")
    code = """
        import io, os
        from worker.sandbox.zygote import threads
        {quiet}
        before = threads.task_ids()
        import tqdm
        bar = tqdm.tqdm(total=2, file=io.StringIO())
        bar.update(1)
        print([t.module for t in threads.started_since(before)])
    """
    assert _run(code.format(quiet="")) == "['tqdm._monitor']"
    assert _run(code.format(quiet="print(threads.quiet_libraries())")) == "['tqdm monitor']\n[]"


def test_torch_fx_interpreter_starts_no_thread_once_quieted() -> None:
    """The path the zygote's warm-up takes: `Interpreter.run` makes a `torch.hub.tqdm`."""
    pytest.importorskip("tqdm")
    code = """
        from worker.sandbox.zygote import threads
        threads.quiet_libraries()
        import torch
        torch.set_num_threads(1)
        before = threads.task_ids()
        gm = torch.fx.symbolic_trace(torch.nn.Linear(2, 2))
        torch.fx.Interpreter(gm).run(torch.ones(1, 2))
        print(len(threads.started_since(before)))
    """
    assert _run(code) == "0"


def test_a_new_thread_is_named_with_its_module() -> None:
    before = threads.task_ids()
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, name="lingering", daemon=True)
    thread.start()
    try:
        found = threads.started_since(before)
    finally:
        stop.set()
        thread.join()
    assert [(t.name, t.module) for t in found] == [("lingering", "threading")]
    message = threads.refusal(found)
    assert "'lingering'" in message
    assert "threading" in message


def test_a_native_thread_is_named_by_the_kernel() -> None:
    found = [threads.NewThread(tid=1, name="omp_worker", module=None)]
    assert "'omp_worker'" in threads.refusal(found)
