"""Setting events on behalf of a signal handler.

Python runs a signal handler in the main thread, between two of that thread's bytecodes:
possibly while the thread is inside ``Event.set()`` of the very event the handler sets.
The event's lock is not reentrant, so the handler would wait for ever on a lock its own
thread holds (a cold stop, SIGQUIT, that lands while the warm stop's handler is setting the
stop). A handler only writes a byte to a pipe instead, and a thread of its own sets the
events.
"""

from __future__ import annotations

import contextlib
import os
import threading

from celery_ratchet.threads import background_thread

_PULL = b"s"
_CLOSE = b"x"


class SignalRelay:
    """Sets ``events`` when :meth:`pull` is called, from a thread of its own."""

    def __init__(self, *events: threading.Event, name: str = "ratchet-signal-relay") -> None:
        self._events = events
        self._name = name
        self._read_fd = -1
        #: -1 once closed: a pull after that does nothing.
        self._write_fd = -1
        #: Both ends, closed by the thread as it ends.
        self._fds: tuple[int, int] = (-1, -1)
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._write_fd >= 0

    def start(self) -> None:
        if self._thread is not None:
            return
        self._read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # a full pipe already holds a pull
        self._write_fd = write_fd
        self._fds = (self._read_fd, write_fd)
        self._thread = background_thread(self._relay, self._name)
        self._thread.start()

    def pull(self) -> None:
        """Set the events soon. Safe in a signal handler: one write to a pipe, no lock."""
        fd = self._write_fd
        if fd < 0:
            return
        with contextlib.suppress(OSError):  # full (a pull is pending) or closed meanwhile
            os.write(fd, _PULL)

    def close(self) -> None:
        """Sets the events one last time and ends the thread (which closes the pipe)."""
        fd, self._write_fd = self._write_fd, -1
        if fd >= 0:
            try:
                os.write(fd, _CLOSE)
            except OSError:  # full: the thread reads and sees no close; end it from here
                os.set_blocking(fd, True)
                os.write(fd, _CLOSE)

    def _relay(self) -> None:
        read_fd = self._read_fd
        try:
            while True:
                data = os.read(read_fd, 256)
                for event in self._events:
                    event.set()
                if not data or _CLOSE in data:
                    return
        finally:
            self._write_fd = -1
            for fd in self._fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
