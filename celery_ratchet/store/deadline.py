"""A deadline on each statement the job store's own connections send.

A connection can go half-open: a NAT or a firewall forgets it, a peer vanishes without a word,
and what is sent on it is never answered, while neither end learns anything (TCP keepalives
cannot tell when the device in between answers them itself). A statement sent on one waits
for ever. So each statement is watched: one that got no reply within its deadline has its
connection's socket shut down, as a network that cut it would. The driver then fails the
statement as a lost connection, SQLAlchemy invalidates that connection and every other one its
pool made before, and the store tries the work once more on a new connection.

One keeper thread per process does the watching: it wakes every half of the shortest deadline
it has been given, so a statement is cut between one and one and a half times its deadline
after it was sent, and nothing wakes it per statement.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from celery_ratchet.threads import background_thread

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Bound:
    """The deadline of an engine's statements: ``seconds``, what sets it (for the warning),
    and where the connections go."""

    seconds: float
    setting: str
    where: str


#: A statement watched: (its deadline, monotonic; its bound; the driver's connection).
_Watch = tuple[float, Bound, Any]


_UNSET: Any = object()
_local = threading.local()


@contextlib.contextmanager
def deadline(bound: Bound | None) -> Iterator[None]:
    """In this thread, statements get ``bound`` instead of their engine's (None: no deadline,
    for a schema change that may run long)."""
    previous = getattr(_local, "bound", _UNSET)
    _local.bound = bound
    try:
        yield
    finally:
        _local.bound = previous


def bound_for(engine_bound: Bound | None) -> Bound | None:
    """The deadline a statement of this thread gets on an engine whose own is ``engine_bound``."""
    chosen = getattr(_local, "bound", _UNSET)
    return engine_bound if chosen is _UNSET else chosen


class _Keeper:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, _Watch] = {}
        self._tick = float("inf")
        self._shorter = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, key: int, dbapi_connection: Any, bound: Bound) -> None:
        if bound.seconds / 2 < self._tick:
            self._shorten(bound.seconds / 2)
        watch = (time.monotonic() + bound.seconds, bound, dbapi_connection)
        with self._lock:
            self._watched[key] = watch

    def unwatch(self, key: int) -> None:
        with self._lock:
            self._watched.pop(key, None)

    def _shorten(self, tick: float) -> None:
        with self._lock:
            self._tick = min(self._tick, tick)
            if self._thread is None:
                self._thread = background_thread(self._run, "ratchet-statement-deadlines")
                self._thread.start()
        self._shorter.set()

    def _run(self) -> None:
        while True:
            self._shorter.wait(self._tick)
            self._shorter.clear()
            now = time.monotonic()
            with self._lock:
                # Shut under the lock: a statement that ends meanwhile waits to unwatch, so its
                # connection is never shut once another statement may be using it.
                overdue = [(k, w) for k, w in self._watched.items() if w[0] <= now]
                for key, (_, _, dbapi_connection) in overdue:
                    del self._watched[key]
                    _shut(dbapi_connection)
            for _, (_, bound, _) in overdue:
                logger.warning(
                    "ratchet: got no reply from the job store at %s within %gs (%s): the "
                    "connection is taken for cut (half-open: a NAT or firewall that forgot it, "
                    "a peer gone) and dropped; the work is tried once more on a new connection",
                    bound.where,
                    bound.seconds,
                    bound.setting,
                )

    def forget(self) -> None:
        """In a forked child: the parent's statements and thread are not this process's."""
        self._lock = threading.Lock()
        self._watched = {}
        self._tick = float("inf")
        self._shorter = threading.Event()
        self._thread = None


def _shut(dbapi_connection: Any) -> None:
    """Shut the socket under a driver's connection down, both ways, from another thread: the
    statement waiting on it fails at once as on a lost connection (psycopg: "server closed the
    connection unexpectedly"; PyMySQL: 2013, "Lost connection")."""
    with contextlib.suppress(Exception):
        pgconn = getattr(dbapi_connection, "pgconn", None)
        if pgconn is not None:  # psycopg 3: a duplicate of libpq's descriptor, same socket
            with socket.socket(fileno=os.dup(pgconn.socket)) as duplicate:
                duplicate.shutdown(socket.SHUT_RDWR)
            return
        own = getattr(dbapi_connection, "_sock", None)  # PyMySQL
        if own is not None:
            own.shutdown(socket.SHUT_RDWR)


_keeper = _Keeper()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_keeper.forget)


def watch(key: int, dbapi_connection: Any, bound: Bound | None) -> None:
    """Watch the statement ``key`` (its cursor's id) about to go out on ``dbapi_connection``."""
    if bound is not None:
        _keeper.watch(key, dbapi_connection, bound)


def unwatch(key: int) -> None:
    """The statement ``key`` got its reply, or failed."""
    _keeper.unwatch(key)


class watched:
    """Around a statement sent through the driver directly (not SQLAlchemy's execution)."""

    __slots__ = ("_key",)

    def __init__(self, dbapi_connection: Any, bound: Bound | None) -> None:
        self._key = id(dbapi_connection)
        watch(self._key, dbapi_connection, bound_for(bound))

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        unwatch(self._key)
