"""One statement on a pooled DBAPI connection, past SQLAlchemy's execution machinery.

A single-row enqueue spends more time in SQLAlchemy around its INSERT (execution context,
result proxy, the Connection object) than in the driver. Here the statement is compiled once
per dialect into the driver's own SQL and parameter order, and each execution is the
driver's ``cursor.execute`` on a connection checked out of the engine's pool. Errors come out
as SQLAlchemy's would (a :class:`~sqlalchemy.exc.DBAPIError` of the same class, a lost
connection invalidated with the pool), so the store translates them exactly as it does any
other statement's. Such statements pass by SQLAlchemy's engine logging (``echo``) and its
cursor events: instrumentation hooked there does not see the single-row insert, the claim or
a COPY of many rows. The statement deadline (store/deadline.py) is kept here as those events
keep it for the others.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.exc import DBAPIError, StatementError
from sqlalchemy.pool import PoolProxiedConnection

from celery_ratchet.store.db_errors import is_read_only
from celery_ratchet.store.deadline import watched
from celery_ratchet.store.engine import statement_bound


@dataclass(frozen=True)
class RawStatement:
    """A statement as its driver takes it: SQL text and how to lay out its parameters."""

    sql: str
    #: Parameter names in order for a positional paramstyle (qmark), else None (named).
    order: tuple[str, ...] | None
    #: The parameter names a caller gives values for.
    names: tuple[str, ...]
    #: Bind processors of typed parameters (datetimes, binary), as SQLAlchemy applies them.
    processors: Mapping[str, Callable[[Any], Any]]
    #: Parameters whose value the statement carries (``.values(status="RUNNING")``), ready
    #: for the driver; a caller's value of the same name never replaces one.
    fixed: Mapping[str, Any] = field(default_factory=dict)

    def parameters(self, values: Mapping[str, Any]) -> Any:
        processors = self.processors
        if self.order is not None:
            given = {**values, **self.fixed} if self.fixed else values
            return tuple(
                processors[n](given[n]) if n in processors else given[n] for n in self.order
            )
        bound = {n: values[n] for n in self.names}
        for name, process in processors.items():
            bound[name] = process(bound[name])
        if self.fixed:
            bound.update(self.fixed)
        return bound


def raw_statement(statement: Any, dialect: Dialect) -> RawStatement:
    compiled = statement.compile(dialect=dialect)
    processors: dict[str, Callable[[Any], Any]] = {}
    fixed: dict[str, Any] = {}
    for bind, name in compiled.bind_names.items():
        if bind.expanding:  # SQLAlchemy renders IN lists at execution: no fixed SQL here
            raise ValueError(f"{name}: an IN list cannot run through the driver directly")
        process = bind.type._cached_bind_processor(dialect)
        if bind.required:
            if process is not None:
                processors[name] = process
            continue
        value = bind.effective_value
        fixed[name] = process(value) if process is not None else value
    order = tuple(compiled.positiontup) if compiled.positional else None
    names = tuple(n for n in dict.fromkeys(compiled.bind_names.values()) if n not in fixed)
    return RawStatement(compiled.string, order, names, processors, fixed)


@contextmanager
def pooled(engine: Engine) -> Iterator[PoolProxiedConnection]:
    """A DBAPI connection of the engine's pool (autocommit, as all of the store's are); a
    connection that cannot be made fails as SQLAlchemy's own ``connect()`` would."""
    dialect = engine.dialect
    try:
        connection = engine.raw_connection()
    except dialect.loaded_dbapi.Error as orig:
        raise DBAPIError.instance(
            None,
            None,
            orig,
            dialect.loaded_dbapi.Error,
            hide_parameters=True,
            connection_invalidated=bool(dialect.is_disconnect(orig, None, None)),
            dialect=dialect,
        ) from orig
    try:
        yield connection
    finally:
        connection.close()  # back to the pool (or discarded, once invalidated)


def execute(
    engine: Engine, connection: PoolProxiedConnection, statement: RawStatement, values: Any
) -> int:
    """Run ``statement`` once; its row count. Driver errors are raised as SQLAlchemy's."""
    count, _ = _run(engine, connection, statement, values, fetch=False)
    return count


def fetch_on(conn: Connection, statement: RawStatement, values: Any) -> list[Sequence[Any]]:
    """Run ``statement`` once on the driver's connection under ``conn``; the rows it returns
    as the driver gives them (columns in the statement's order). Driver errors are raised as
    SQLAlchemy's; a lost connection invalidates ``conn`` too, as SQLAlchemy's own execution
    does, so that whatever runs on ``conn`` next (a ROLLBACK) knows it is gone."""
    _, rows = _run(conn.engine, conn.connection, statement, values, fetch=True, owner=conn)
    return rows


def execute_on(conn: Connection, statement: RawStatement, values: Any) -> int:
    """Run ``statement`` once on the driver's connection under ``conn``; its row count.
    Errors as :func:`fetch_on`'s."""
    count, _ = _run(conn.engine, conn.connection, statement, values, fetch=False, owner=conn)
    return count


def execute_many_on(conn: Connection, statement: RawStatement, rows: Sequence[Any]) -> None:
    """Run ``statement`` once for each of ``rows`` in one driver ``executemany`` (psycopg
    pipelines it) on the driver's connection under ``conn``; errors as :func:`fetch_on`'s."""
    _run(conn.engine, conn.connection, statement, rows, fetch=False, owner=conn, many=True)


def copy_in_on(conn: Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """Stream ``rows`` (values in the columns' order) into a ``COPY … FROM STDIN`` on the
    driver's connection under ``conn``: psycopg 3's copy, in the connection's transaction.
    Errors as :func:`fetch_on`'s (a duplicate key is SQLAlchemy's IntegrityError)."""
    engine, connection = conn.engine, conn.connection
    cursor = None
    try:
        cursor = connection.cursor()
        bound = statement_bound(engine)
        with watched(connection.dbapi_connection, bound), cursor.copy(sql) as copy:
            for row in rows:
                copy.write_row(row)
        cursor.close()
    except engine.dialect.loaded_dbapi.Error as orig:
        raise _translated(engine, connection, cursor, sql, None, orig, conn) from orig
    except BaseException as exc:
        _lose(connection, conn, exc)
        raise


def _run(
    engine: Engine,
    connection: PoolProxiedConnection,
    statement: RawStatement,
    values: Any,
    *,
    fetch: bool,
    owner: Connection | None = None,
    many: bool = False,
) -> tuple[int, list[Sequence[Any]]]:
    dialect = engine.dialect
    parameters = [statement.parameters(v) for v in values] if many else statement.parameters(values)
    cursor = None
    try:
        cursor = connection.cursor()
        with watched(connection.dbapi_connection, statement_bound(engine)):
            if many:
                cursor.executemany(statement.sql, parameters)
            else:
                cursor.execute(statement.sql, parameters)
        rows: list[Sequence[Any]] = list(cursor.fetchall()) if fetch else []
        count: int = cursor.rowcount
        cursor.close()
        return count, rows
    except dialect.loaded_dbapi.Error as orig:
        sql = statement.sql
        raise _translated(engine, connection, cursor, sql, parameters, orig, owner) from orig
    except BaseException as exc:
        _lose(connection, owner, exc)
        raise


def _translated(
    engine: Engine,
    connection: PoolProxiedConnection,
    cursor: Any,
    sql: str,
    parameters: Any,
    orig: Any,
    owner: Connection | None,
) -> StatementError:
    """A driver error as SQLAlchemy's own execution raises it (parameters hidden); a lost
    connection is invalidated with the pool's others, as SQLAlchemy does."""
    dialect = engine.dialect
    lost = bool(dialect.is_disconnect(orig, connection, cursor)) or is_read_only(orig)
    if lost:
        engine.pool._invalidate(connection, orig)
        if owner is not None and not owner.invalidated:
            owner.invalidate(orig)
    _close_quietly(cursor)
    error: StatementError = DBAPIError.instance(
        sql,
        parameters,
        orig,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=dialect,
    )
    return error


def _lose(connection: PoolProxiedConnection, owner: Connection | None, exc: BaseException) -> None:
    """Interrupted mid-statement: the connection's protocol state is unknown."""
    if owner is not None and not owner.invalidated:
        owner.invalidate(exc if isinstance(exc, Exception) else None)
    else:
        connection.invalidate()


def _close_quietly(cursor: Any) -> None:
    if cursor is None:
        return
    # The connection is failing already: its first error is the one raised.
    with suppress(Exception):
        cursor.close()
