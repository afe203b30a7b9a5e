"""Time budgets of the deployment targets: how long each may take (`share`), and the
limit that stops one at its budget (`limit`), raising `TargetTimeout` in the export's
thread wherever it is.

Torch-free: the sandbox's toolchain broker (worker.sandbox.child.requests) marks its exchanges
with the zygote `deferred`, so that a budget never interrupts one halfway (the answer
would then reach the next target's request).

In the main thread the budget is a one-shot `ITIMER_REAL` whose SIGALRM handler raises;
the handler is installed with SA_RESTART, so a thread pool's system calls (ONNX Runtime's,
XNNPACK's) are restarted, never failed with EINTR, while a sleep in the export's own
thread is cut short. In another thread (signals go to the main thread only), a timer
thread raises it there asynchronously (`PyThreadState_SetAsyncExc`): between two bytecodes,
never inside a call into native code. Neither raises inside an import (the package would
stay half imported for the later targets): it looks again 50 ms later. Either way a long
native call (a compile, a kernel) ends first: the job's own `timeout_s` is the limit
nothing outlasts.
"""

from __future__ import annotations

import ctypes
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType

__all__ = ["RESERVE_S", "TargetTimeout", "deferred", "limit", "reserve", "share"]

RESERVE_S = (2.0, 30.0)
"""The least and the most of the job's time kept back from the targets (`reserve`)."""
RESERVE_SHARE = 0.05
"""The share of the job's time limit kept back from the targets, within `RESERVE_S`."""


class TargetTimeout(BaseException):
    """A target ran past its budget. A BaseException, so that a converter's `except
    Exception` (which retries, or falls back) does not swallow it."""


def reserve(time_limit_s: float) -> float:
    """What the targets leave of the job's time: for its report, its profiles (half of
    what is left after the targets), the worker taking its files, and the few hundred
    milliseconds between the worker's clock and the job's."""
    low, high = RESERVE_S
    return min(high, max(low, RESERVE_SHARE * time_limit_s))


def share(left_s: float, time_limit_s: float, targets_left: int, option: float | None) -> float:
    """The budget of the next target: option `target_timeout_s` when set, else an equal
    share among the `targets_left` targets (itself included) of what is left of the job;
    never more than the job has left, less `reserve`. May be 0 (no time left)."""
    available = max(0.0, left_s - reserve(time_limit_s))
    if option is not None:
        return min(option, available)
    return available / max(1, targets_left)


class _State:
    """The budget in force in this process (one export at a time runs targets)."""

    def __init__(self) -> None:
        self.deferring = 0
        self.owed = False
        """The budget ran out while deferred: `TargetTimeout` is raised when it ends."""
        self.armed = False


_state = _State()


@contextmanager
def deferred() -> Iterator[None]:
    """A stretch a budget may not interrupt (an exchange with the zygote): a budget that
    runs out meanwhile raises `TargetTimeout` as it ends."""
    _state.deferring += 1
    try:
        yield
    finally:
        _state.deferring -= 1
    if not _state.deferring and _state.owed:
        _state.owed = False
        raise TargetTimeout


RETRY_S = 0.05
"""How soon a budget that ran out during an import looks again."""


def _importing(frame: FrameType | None) -> bool:
    """Whether `frame` or a caller is importing a module: an exception raised there leaves
    its package half imported for the rest of the process (a later `import onnxscript`
    found no `onnxscript.values`), so the budget waits for the import to end."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _expired() -> None:
    """The budget ran out: raise, unless deferred (then once the deferral ends)."""
    if not _state.armed:
        return
    _state.armed = False
    if _state.deferring:
        _state.owed = True
        return
    raise TargetTimeout


@contextmanager
def limit(seconds: float | None) -> Iterator[None]:
    """Raise `TargetTimeout` in this thread once `seconds` have passed, once; None: no
    limit. What swallowed it and went on still ends in `TargetTimeout`, when the block
    ends (a budget that ran out is out)."""
    if seconds is None:
        yield
        return
    seconds = max(seconds, 1e-3)  # a zero timer is no timer
    _state.armed, _state.owed = True, False
    main = threading.current_thread() is threading.main_thread()
    stop = _alarm(seconds) if main else _async(seconds)
    try:
        yield
    finally:
        fired = not _state.armed
        stop()
        _state.armed = _state.owed = False
    if fired:  # ran out and was swallowed: the target is still over its budget
        raise TargetTimeout


def _alarm(seconds: float) -> Callable[[], None]:
    def handler(signum: int, frame: FrameType | None) -> None:
        if _state.armed and _importing(frame):
            signal.setitimer(signal.ITIMER_REAL, RETRY_S)
            return
        _expired()

    previous = signal.signal(signal.SIGALRM, handler)
    signal.siginterrupt(signal.SIGALRM, False)
    signal.setitimer(signal.ITIMER_REAL, seconds)

    def stop() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL if previous is None else previous)

    return stop


def _async(seconds: float) -> Callable[[], None]:
    thread = threading.get_ident()
    lock = threading.Lock()
    timers: list[threading.Timer] = []

    def start(delay: float) -> None:
        timer = threading.Timer(delay, fire)
        timer.daemon = True
        timers.append(timer)
        timer.start()

    def fire() -> None:
        with lock:
            if not _state.armed:
                return
            if _importing(sys._current_frames().get(thread)):
                start(RETRY_S)
                return
            if _state.deferring:
                _state.armed, _state.owed = False, True
                return
            _state.armed = False
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(thread), ctypes.py_object(TargetTimeout)
            )

    start(seconds)

    def stop() -> None:
        with lock:
            for timer in timers:
                timer.cancel()
            if not _state.armed and not _state.owed:  # set but not yet raised: withdrawn
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), None)

    return stop
