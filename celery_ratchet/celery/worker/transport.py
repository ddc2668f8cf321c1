"""The worker's stand-in for a broker connection: Celery's in-memory transport, whose wait
for the next message a stop can cut short.

Nothing travels over it. Celery's main loop on a transport like this one checks for a stop
between two waits of up to two seconds (polling once a second); a stop signal wakes the wait
at once instead (:func:`wake`, safe in a signal handler: one write to a pipe). Once the worker
is stopping no wait begins: Celery's loop still waits once more after it saw the stop.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from typing import Any

from celery.worker import state as worker_state
from kombu.transport import memory

from celery_ratchet.celery.execution.stopping import RUNNING, stop_mode

_pipe: tuple[int, int] | None = None


def _fds() -> tuple[int, int]:
    global _pipe
    if _pipe is None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        _pipe = (read, write)
    return _pipe


def _stopping() -> bool:
    """A stop signal arrived, or Celery's own stop flags were set without one (as
    ``celery.contrib.testing.worker.start_worker`` ends its worker)."""
    return stop_mode() != RUNNING or any(
        flag is not None and flag is not False
        for flag in (worker_state.should_stop, worker_state.should_terminate)
    )


def wake() -> None:
    """End the current wait of the worker's main loop (it then looks for a stop)."""
    with contextlib.suppress(OSError):  # the pipe is full: a wake-up is pending anyway
        os.write(_fds()[1], b"!")


class Channel(memory.Channel):
    def _purge(self, queue: str) -> int:
        """``celery purge`` (``compat.CHANNEL_PURGE_METHOD``): the pending jobs of ``queue``
        are deleted from the store, and their number is what was purged."""
        purged = int(super()._purge(queue) or 0)
        app = getattr(self.connection.client, "ratchet_app", None)
        if app is None:
            return purged
        from celery_ratchet.celery.state import ratchet_state

        return purged + ratchet_state(app).store.purge_pending([queue])


class Transport(memory.Transport):
    Channel = Channel

    def drain_events(self, connection: Any, timeout: float | None = None, **_: Any) -> Any:
        read = _fds()[0]
        started = time.monotonic()
        while True:
            try:
                return super().drain_events(connection, timeout=0)
            except TimeoutError:
                pass
            if _stopping():  # the loop has to see it, not wait again
                return None
            waited = time.monotonic() - started
            if timeout is not None and waited >= timeout:
                raise TimeoutError()
            step = self.polling_interval or 1.0
            if timeout is not None:
                step = min(step, timeout - waited)
            if select.select([read], [], [], step)[0]:
                with contextlib.suppress(BlockingIOError):
                    while os.read(read, 512):
                        pass
                return None
