"""Many job rows in few statements, within what the database takes: pipelined chunks on
PostgreSQL and SQLite, multi-row statements within ``max_allowed_packet`` on MySQL/MariaDB."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from sqlalchemy.engine import Connection

from celery_ratchet.domain.job import NewJob
from celery_ratchet.errors import InvalidJob
from celery_ratchet.store.database import Database
from celery_ratchet.store.dialect import Dialect
from celery_ratchet.store.job_rows import (
    BULK_ROWS,
    COPY_JOBS,
    NOTIFY_CHANNEL,
    bulk_params,
    copied_row,
    insert_statement,
    pipeline_chunks,
)
from celery_ratchet.store.packets import packet_limit
from celery_ratchet.store.raw import copy_in_on, execute_many_on, raw_statement

#: Rows smaller than this are never near a MySQL/MariaDB packet: no check is made.
_PACKET_CHECKED_BYTES = 1024 * 1024

#: PostgreSQL (psycopg 3): from this many rows a write is a COPY; fewer are pipelined INSERTs,
#: where COPY's two more round trips (the clock, the notification) would cost more than they save.
_COPIED_ROWS = 20


class RowWriter:
    """The job INSERT, prepared once: of one row, of many at once, and the size check
    MySQL/MariaDB needs first."""

    _max_packet: int | None = None

    def __init__(self, db: Database, dialect: Dialect) -> None:
        self.db = db
        self.dialect = dialect
        self._prepare()
        db.when_silent(self._prepare)

    def _prepare(self) -> None:
        """The inserts, notifying listening workers while the database does."""
        sa = self.db.engine.dialect
        #: One job row; PostgreSQL with wake-ups on: notifying its queue.
        self.insert = insert_statement(sa, notify=self.db.notify)
        #: The same, through the driver itself (store/raw.py).
        self.raw_insert = raw_statement(self.insert, sa)
        #: One job row with a business key (see ``insert_statement``).
        self.insert_keyed_row = insert_statement(sa, notify=self.db.notify, keyed=True)

    def check_packet(self, jobs: Sequence[NewJob], waiting: Sequence[NewJob]) -> None:
        """On MySQL/MariaDB a row is sent in one statement, which the server takes only
        within ``max_allowed_packet``; one over it is dropped with the connection, which
        would read as an outage whose outcome is unknown. Refuse it before sending."""
        if not self.dialect.limits_statement_size:
            return
        sizes = [
            (len(j.message.payload) + len(j.message.headers) + len(j.message.properties), j)
            for j in (*jobs, *waiting)
        ]
        size, largest = max(sizes, key=lambda pair: pair[0], default=(0, None))
        if largest is None or size < _PACKET_CHECKED_BYTES:
            return
        if size > self._statement_budget():
            raise InvalidJob(
                "payload",
                f"job of task {largest.task_name!r} is {size / 2**20:.1f} MB; this MySQL/MariaDB "
                f"server takes statements of at most {(self._max_packet or 0) / 2**20:.0f} MB "
                "(max_allowed_packet), about half of it for a row: raise max_allowed_packet "
                "on the server, or pass a reference instead of the data",
            )

    def _statement_budget(self, conn: Connection | None = None) -> int:
        """The bytes of rows one MySQL/MariaDB statement may carry: escaped for the
        statement, a row can take up to twice its bytes, within ``max_allowed_packet`` (as
        the store's last new connection read it; read here where none did)."""
        limit = packet_limit(self.db.engine) or self._max_packet
        if limit is None:

            def read(c: Connection) -> int:
                return int(c.exec_driver_sql("SELECT @@max_allowed_packet").scalar_one())

            limit = self._max_packet = (
                read(conn)
                if conn is not None
                else self.db.run(read, "the packet size was not read")
            )
        return limit // 2 - 64 * 1024

    def insert_many(
        self,
        conn: Connection,
        params: list[dict[str, Any]],
        *,
        ignore_existing: bool = False,
    ) -> None:
        # Measured per 1,000 rows: psycopg and sqlite3 pipeline executemany (25k and 60k
        # rows/s); PyMySQL sends it row by row (4.5k/s) but multi-row VALUES reach 15k/s.
        if self.dialect.batches_executemany:
            if conn.dialect is self.db.engine.dialect and not ignore_existing:
                if len(params) >= _COPIED_ROWS and self.dialect.copies_rows(conn):
                    self._copy_in(conn, params)
                    return
                # Through the driver itself, as the single-row insert: SQLAlchemy's parameter
                # building per row was a tenth of a 1,000-row write. Only on the store's own
                # connections: a caller's (enqueue_within) may be of another driver
                # (psycopg2), which the statement was not compiled for.
                for rows in pipeline_chunks(params):
                    execute_many_on(conn, self.raw_insert, rows)
                return
            statement = (
                insert_statement(conn.dialect, 1, True, self.db.notify)
                if ignore_existing
                else self.insert
            )
            for rows in pipeline_chunks(params):
                conn.execute(statement, rows)
            return
        for chunk in self._statements_of(conn, params):
            statement = insert_statement(conn.dialect, len(chunk), ignore_existing)
            conn.execute(statement, chunk[0] if len(chunk) == 1 else bulk_params(chunk))

    def _copy_in(self, conn: Connection, params: list[dict[str, Any]]) -> None:
        """The rows through COPY, as the INSERT would write them: the same clock (``now()``
        is the transaction's start, whatever statement reads it), each queue notified once
        (PostgreSQL folds a transaction's equal notifications into one anyway)."""
        now = conn.exec_driver_sql("SELECT now()").scalar_one()
        bind = self.raw_insert.parameters
        copy_in_on(conn, COPY_JOBS, [copied_row(bind(p), now) for p in params])
        if self.db.notify:
            conn.exec_driver_sql(
                "SELECT pg_notify(%(channel)s, queue) FROM unnest(%(queues)s::text[]) AS queue",
                {"channel": NOTIFY_CHANNEL, "queues": sorted({p["p_queue"] for p in params})},
            )

    def _statements_of(
        self, conn: Connection, params: list[dict[str, Any]]
    ) -> Iterator[list[dict[str, Any]]]:
        """Rows in chunks of at most BULK_ROWS rows and of what one statement may carry."""
        sizes = [len(p["p_payload"]) + len(p["p_headers"]) + len(p["p_properties"]) for p in params]
        if sum(sizes) < _PACKET_CHECKED_BYTES:
            for start in range(0, len(params), BULK_ROWS):
                yield params[start : start + BULK_ROWS]
            return
        budget = self._statement_budget(conn)
        chunk: list[dict[str, Any]] = []
        carried = 0
        for row, size in zip(params, sizes, strict=True):
            if chunk and (len(chunk) >= BULK_ROWS or carried + size > budget):
                yield chunk
                chunk, carried = [], 0
            chunk.append(row)
            carried += size
        if chunk:
            yield chunk
