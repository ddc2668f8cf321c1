"""A unit of work: writes that join one database transaction, handed above the store
without its connection.

A unit is the caller's own transaction (``celery_ratchet.transaction(conn)``, a Django
``atomic()`` block), or the one in which the store has just decided something that what
follows must commit with: a batch's end (its callback is sent in it), a workflow's branches
(the fired ones are sent in it). The layers above pass a unit back to the store and never
read it; only store modules reach its connection (:func:`connection_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection
from sqlalchemy.orm import Session

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.dialect import dialect_of

#: Run a function once the owner's transaction commits (Django's ``on_commit``).
AfterCommit = Callable[[Callable[[], None]], None]


class Unit:
    __slots__ = ("_connection", "_store_owned", "after_commit")

    def __init__(
        self,
        connection: Connection,
        after_commit: AfterCommit | None = None,
        *,
        store_owned: bool = False,
    ) -> None:
        self._connection = connection
        #: The store's own transaction (a batch's end, a workflow's decision): its lock
        #: conflicts are the store's to retry, raised as the driver's errors to its retry.
        self._store_owned = store_owned
        #: Set when the transaction is Django's: what must wait for its commit (a Redis
        #: wake-up) is handed to it. PostgreSQL's NOTIFY waits for the commit by itself.
        self.after_commit = after_commit

    @property
    def sends_join(self) -> bool:
        """Whether jobs sent after the store's own decision can be written in this unit.
        SQLite has one writer: the store commits each statement of its decisions at once
        there (a transaction held open would block this process's other connections), so
        what follows is written on its own."""
        return not dialect_of(self._connection).single_writer

    def __repr__(self) -> str:
        return f"<Unit of work on {self._connection.engine.url.get_backend_name()}>"


def connection_of(unit: Unit) -> Connection:
    """The connection a unit writes on; for store modules only."""
    return unit._connection


def is_callers(unit: Unit) -> bool:
    """Whether the unit is a caller's own transaction, not one the store opened."""
    return not unit._store_owned


def unit_of(target: Any) -> Unit:
    """The unit of the caller's SQLAlchemy ``Connection`` (inside its transaction) or
    ``Session`` (the connection of its transaction)."""
    if isinstance(target, Unit):
        return target
    if isinstance(target, Connection):
        return Unit(target)
    if isinstance(target, Session) or callable(getattr(target, "connection", None)):
        connection = target.connection()  # a scoped_session too
        if isinstance(connection, Connection):
            return Unit(connection)
    raise ConfigurationError(
        f"celery_ratchet.transaction() takes a SQLAlchemy Connection or Session, or Django's "
        f"connection, not {type(target).__name__}; pass the connection whose transaction the "
        "jobs must join"
    )
