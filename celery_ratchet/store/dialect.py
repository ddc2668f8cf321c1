"""What each database does differently on the runtime path, as named capabilities.

One :class:`Dialect` per database family (PostgreSQL, MySQL/MariaDB, SQLite). The store's
operations ask it (``dialect.notifies``, ``dialect.claim_strategy()``) instead of comparing
database names inline. Schema and DDL differences stay with the schema (store/ddl.py,
store/schema.py); how connections are made stays with the engine (store/engine.py).
"""

from __future__ import annotations

import math
import weakref
from typing import Any, ClassVar

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Connection
from sqlalchemy.engine import Dialect as SADialect
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.elements import TextClause
from sqlalchemy.sql.selectable import TextualSelect

from celery_ratchet.store.claim_sql import (
    CLAIMED_SET,
    RETURNED,
    Claimed,
    ClaimShape,
    ClaimStrategy,
    UpdateReturning,
    candidates,
    decode,
    prepared,
)
from celery_ratchet.store.db_clock import db_now
from celery_ratchet.store.engine import family
from celery_ratchet.store.schema import ACTIVE_KEY_WHERE, MYSQL_ACTIVE_KEY_COLUMN


class Dialect:
    """One database family's differences. ``sa``: the SQLAlchemy dialect statements are
    compiled for."""

    #: The family's name: ``postgresql``, ``mysql`` (MariaDB too) or ``sqlite``.
    name: ClassVar[str]
    #: Wake-ups through LISTEN/NOTIFY (``pg_notify``), delivered at commit.
    notifies: ClassVar[bool] = False
    #: One writer at a time: a transaction holds the database's write lock, so rows need no
    #: locks of their own, and a transaction held open blocks this process's other
    #: connections (the store's decisions commit statement by statement there).
    single_writer: ClassVar[bool] = False
    #: ``UPDATE ... RETURNING``: a claim or a release reads back its rows in one statement.
    updates_returning: ClassVar[bool] = True
    #: The driver sends ``executemany`` as one batch (pipelined, or in C): many rows cost
    #: one call. Without (PyMySQL, row by row) the store groups rows into multi-row statements.
    batches_executemany: ClassVar[bool] = True
    #: A statement larger than the server's ``max_allowed_packet`` is dropped with its
    #: connection: rows are measured before they are sent.
    limits_statement_size: ClassVar[bool] = False
    #: A whole batch of outcomes (or results) is one statement over array parameters.
    settles_by_arrays: ClassVar[bool] = False
    #: A look-up of many job ids is one array parameter (``= ANY(%(ids)s)``).
    looks_up_by_array: ClassVar[bool] = False
    #: The database's clock is this host's own (read in milliseconds): nodes measure
    #: nothing against it.
    clock_is_hosts: ClassVar[bool] = False
    #: An INSERT with a business key skips a key an active job holds (the partial unique
    #: index arbitrates, ``ON CONFLICT ... DO NOTHING``); without, the duplicate-key error
    #: names the index instead.
    inserts_skipping_held_keys: ClassVar[bool] = True

    def __init__(self, sa: SADialect) -> None:
        self.sa = sa

    @property
    def locks_rows(self) -> bool:
        """``SELECT ... FOR UPDATE`` locks the rows it reads (not on a single writer, whose
        transaction holds the whole database)."""
        return not self.single_writer

    def now(self) -> str:
        """The database's clock, as SQL text for statements written as text."""
        return str(db_now().compile(dialect=self.sa))

    def insert_ignoring_taken_ids(self) -> tuple[str, str]:
        """(``INSERT INTO`` as written, the clause after VALUES) of an insert that skips a
        row whose job id is taken: only that, never other errors (MySQL's INSERT IGNORE
        would also swallow an id cut short to fit its column)."""
        return "INSERT INTO", " ON DUPLICATE KEY UPDATE job_id = job_id"

    def key_holder(self, *, locking: bool) -> TextClause:
        """The job holding ``:key`` as an active business key. ``locking``: the latest
        committed row, even inside a caller's transaction whose snapshot predates it."""
        return text(
            f"SELECT job_id FROM scheduler_job WHERE business_key = :key AND {ACTIVE_KEY_WHERE}"
        )

    def claim_strategy(self) -> ClaimStrategy:
        """How a batch of due jobs is claimed on this database (store/claim_sql.py's SQL)."""
        raise NotImplementedError(
            f"no claim strategy for {self.sa.name!r}; celery_ratchet supports "
            "PostgreSQL, MySQL 8 / MariaDB 10.6+ and SQLite"
        )

    def copies_rows(self, conn: Connection) -> bool:
        """Whether many rows can be written with COPY on ``conn``, as given."""
        return False

    def end_if_idle(self, conn: Connection, seconds: float) -> None:
        """Have the server end the transaction open on ``conn`` (and the connection) once it
        sits idle for ``seconds``: a client stopped inside it (Ctrl-Z, a frozen VM) releases
        its row locks instead of holding them until its connection dies. Nothing where the
        server has no such limit (MySQL) or no other writer waits (SQLite)."""

    def lift_idle_limit(self, conn: Connection) -> None:
        """Undo :meth:`end_if_idle` where it outlives the transaction (a MariaDB session's
        setting), so that the pooled connection's later transactions are not ended by it."""


class PostgreSQL(Dialect):
    name = "postgresql"
    notifies = True
    settles_by_arrays = True
    looks_up_by_array = True

    def insert_ignoring_taken_ids(self) -> tuple[str, str]:
        return "INSERT INTO", " ON CONFLICT (job_id) DO NOTHING"

    def claim_strategy(self) -> ClaimStrategy:
        return PostgresClaim(self.now())

    def copies_rows(self, conn: Connection) -> bool:
        """psycopg 3, and a session with ``standard_conforming_strings`` on (off, psycopg's
        text escaping of bytes doubles the backslash of its hex form, and COPY would store
        that text instead of the payload)."""
        if conn.dialect.driver != "psycopg":
            return False
        info = getattr(conn.connection.dbapi_connection, "info", None)
        return info is not None and info.parameter_status("standard_conforming_strings") == "on"

    def end_if_idle(self, conn: Connection, seconds: float) -> None:
        ms = max(1, round(seconds * 1000))
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = {ms}")


class MySQL(Dialect):
    """MySQL 8 and MariaDB 10.6+."""

    name = "mysql"
    updates_returning = False
    batches_executemany = False
    limits_statement_size = True
    inserts_skipping_held_keys = False

    def key_holder(self, *, locking: bool) -> TextClause:
        # A locking read sees the latest committed row, even inside a caller's
        # REPEATABLE READ transaction whose snapshot predates the holder.
        lock = " LOCK IN SHARE MODE" if locking else ""
        return text(
            f"SELECT job_id FROM scheduler_job WHERE {MYSQL_ACTIVE_KEY_COLUMN} = :key{lock}"
        )

    def claim_strategy(self) -> ClaimStrategy:
        return MySQLClaim(self.now())

    def end_if_idle(self, conn: Connection, seconds: float) -> None:
        if getattr(conn.dialect, "is_mariadb", False):  # a session's setting: it stays
            whole = max(1, math.ceil(seconds))
            conn.exec_driver_sql(f"SET SESSION idle_transaction_timeout = {whole}")

    def lift_idle_limit(self, conn: Connection) -> None:
        if getattr(conn.dialect, "is_mariadb", False) and not conn.invalidated:
            try:
                conn.exec_driver_sql("SET SESSION idle_transaction_timeout = DEFAULT")
            except SQLAlchemyError:
                conn.invalidate()  # never back to the pool with the limit on


class SQLite(Dialect):
    name = "sqlite"
    single_writer = True
    clock_is_hosts = True

    def insert_ignoring_taken_ids(self) -> tuple[str, str]:
        return "INSERT OR IGNORE INTO", ""

    def claim_strategy(self) -> ClaimStrategy:
        return SQLiteClaim(self.now())


_FAMILIES: dict[str, type[Dialect]] = {"postgresql": PostgreSQL, "mysql": MySQL, "sqlite": SQLite}
_known: weakref.WeakKeyDictionary[SADialect, Dialect] = weakref.WeakKeyDictionary()


def dialect_for(sa: SADialect) -> Dialect:
    """The :class:`Dialect` of statements compiled for ``sa`` (one per SQLAlchemy dialect)."""
    found = _known.get(sa)
    if found is None:
        found = _known[sa] = _FAMILIES.get(family(sa.name), Dialect)(sa)
    return found


def dialect_of(conn: Connection) -> Dialect:
    """The :class:`Dialect` of ``conn`` (the store's own, or a caller's of another driver)."""
    return dialect_for(conn.dialect)


# -- the claim strategies ----------------------------------------------------------------------


class PostgresClaim(UpdateReturning):
    # ANY(ARRAY(...)) runs the locking subquery once, ahead of the update, which then finds
    # its rows by primary key. The rows are locked while PENDING (the lock re-checks the
    # condition), so the update needs no status test, which would tempt the planner onto
    # the status index and its dead entries.
    #
    # The batch size is written into the statement: bound, it left the plan that the driver's
    # prepared statement keeps for any value estimated at a tenth of the due rows, always
    # dearer than the plan for each claim's own value, so every claim was planned again
    # (0.58 ms, more than it ran; docs/bench.md). Written in, a worker's few sizes each keep
    # their plan.
    kind, lock, needs_transaction, sized = "postgresql", True, False, True
    where = "id = ANY(ARRAY(SELECT id FROM ({picked}) AS picked))"


class SQLiteClaim(UpdateReturning):
    # The write lock is taken up front (BEGIN IMMEDIATE), so claimers queue instead of failing.
    kind, lock, needs_transaction = "sqlite", False, True
    where = "status = 'PENDING' AND id IN (SELECT id FROM ({picked}))"


class MySQLClaim:
    # No UPDATE ... RETURNING: lock and read the rows, then flip them, in one transaction.
    needs_transaction = True

    def __init__(self, now: str) -> None:
        self.now = now
        self.mark_running = text(
            f"UPDATE scheduler_job SET {CLAIMED_SET.format(now=now)} "
            "WHERE id IN :ids AND status = 'PENDING'"
        ).bindparams(bindparam("ids", expanding=True))
        self._selects: dict[ClaimShape, TextualSelect] = {}  # as UpdateReturning's

    def select_locked(self, shape: ClaimShape) -> TextualSelect:
        found = self._selects.get(shape)
        if found is None:
            columns = f"{RETURNED}, {self.now} AS claimed_now"
            found = self._selects[shape] = prepared(
                candidates("mysql", self.now, shape, columns, True)
            )
        return found

    def claim(self, conn: Connection, shape: ClaimShape, params: dict[str, Any]) -> Claimed:
        rows = conn.execute(self.select_locked(shape), params).all()
        if not rows:
            return Claimed([], [])
        ids = [r.id for r in rows]
        conn.execute(
            self.mark_running, {"node": params["node"], "token": params["token"], "ids": ids}
        )
        return decode(rows, params["token"], claims_offset=1)
