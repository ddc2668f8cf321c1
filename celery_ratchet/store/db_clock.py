"""The database's clock in SQL, per dialect: one clock for every node."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Float
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement
from sqlalchemy.sql.visitors import InternalTraversal

from celery_ratchet.store.schema import UTCDateTime


class db_now(FunctionElement[Any]):
    """The database's current UTC time: one clock for every node."""

    type = UTCDateTime()
    inherit_cache = True
    name = "db_now"


@compiles(db_now, "postgresql")
def _now_pg(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "now()"


@compiles(db_now, "mysql")
@compiles(db_now, "mariadb")
def _now_mysql(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    return "UTC_TIMESTAMP(6)"


@compiles(db_now, "sqlite")
def _now_sqlite(element: db_now, compiler: SQLCompiler, **kw: Any) -> str:
    # Six fraction digits, the format SQLAlchemy writes and parses for SQLite datetimes.
    return "(strftime('%Y-%m-%d %H:%M:%f', 'now') || '000')"


class db_now_minus(FunctionElement[Any]):
    """The database's current UTC time minus a fixed number of seconds."""

    type = UTCDateTime()
    # The seconds are written into the SQL: they are part of the statement's cache key, so a
    # statement using this is compiled once per value instead of at every execution.
    inherit_cache = True
    _traverse_internals = [
        *FunctionElement._traverse_internals,
        ("seconds", InternalTraversal.dp_plain_obj),
    ]
    name = "db_now_minus"

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)
        super().__init__()


@compiles(db_now_minus, "postgresql")
def _ago_pg(element: db_now_minus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(now() - interval '{element.seconds:.6f} seconds')"


@compiles(db_now_minus, "mysql")
@compiles(db_now_minus, "mariadb")
def _ago_mysql(element: db_now_minus, compiler: SQLCompiler, **kw: Any) -> str:
    return f"(UTC_TIMESTAMP(6) - INTERVAL {int(element.seconds * 1_000_000)} MICROSECOND)"


@compiles(db_now_minus, "sqlite")
def _ago_sqlite(element: db_now_minus, compiler: SQLCompiler, **kw: Any) -> str:
    # A signed modifier: "--5 seconds" (minus a negative age) would be NULL in SQLite.
    return f"(strftime('%Y-%m-%d %H:%M:%f', 'now', '{-element.seconds:+.3f} seconds') || '000')"


class seconds_between(FunctionElement[Any]):
    """``later - earlier`` in seconds (a float), per dialect: run and wait times."""

    type = Float()
    inherit_cache = True
    name = "seconds_between"

    def __init__(self, later: Any, earlier: Any) -> None:
        super().__init__(later, earlier)


@compiles(seconds_between, "postgresql")
def _between_pg(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(c, **kw) for c in element.clauses)
    # None where either is infinite (written by hand): PostgreSQL refuses to subtract those.
    return (
        f"CASE WHEN isfinite({later}) AND isfinite({earlier}) "
        f"THEN EXTRACT(EPOCH FROM ({later} - {earlier})) END"
    )


@compiles(seconds_between, "mysql")
@compiles(seconds_between, "mariadb")
def _between_mysql(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(c, **kw) for c in element.clauses)
    return f"(TIMESTAMPDIFF(MICROSECOND, {earlier}, {later}) / 1000000.0)"


@compiles(seconds_between, "sqlite")
def _between_sqlite(element: seconds_between, compiler: SQLCompiler, **kw: Any) -> str:
    later, earlier = (compiler.process(c, **kw) for c in element.clauses)
    return f"((julianday({later}) - julianday({earlier})) * 86400.0)"
