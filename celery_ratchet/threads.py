"""The threads celery_ratchet starts, which leave the process's signals to its main thread.

A signal sent to a process is taken by any one of its threads that does not block it; where
its action is the default one (terminate), the thread that takes it ends the whole process at
once, whatever the main thread is doing. A billiard pool process blocks SIGTERM in its main
thread while it writes its last message to the pool's result pipe, so that it cannot die
holding the pipe's lock; a thread of ours taking the signal instead killed it there, and every
pool process after it waited on that lock for good (a revoke with terminate left a worker
running nothing). Python runs handlers in the main thread whichever thread takes a signal, so
blocking it elsewhere changes nothing else.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

#: Raised by a thread's own fault, always delivered to that thread: never blocked.
_SYNCHRONOUS = {
    getattr(signal, name)
    for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGSYS", "SIGABRT")
    if hasattr(signal, name)
}


def background_thread(
    target: Callable[..., Any], name: str, args: tuple[Any, ...] = (), daemon: bool = True
) -> threading.Thread:
    """A thread (not started) running ``target(*args)`` with every asynchronous signal
    blocked, so that only the main thread takes them."""

    def run(*given: Any) -> None:
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_BLOCK, signal.valid_signals() - _SYNCHRONOUS)
        target(*given)

    return threading.Thread(target=run, args=args, name=name, daemon=daemon)
