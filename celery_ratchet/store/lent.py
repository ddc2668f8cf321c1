"""SQLAlchemy connections over a DB-API connection that belongs to someone else.

A web framework (Django) holds its own DB-API connection and its own transaction on it. To
write jobs in that transaction, the store's statements must run on that very connection, as
a SQLAlchemy :class:`Connection` the store already knows how to use. The connection is lent,
not given: committing, rolling back and closing stay its owner's, so SQLAlchemy's own
transaction handling (autobegin, the rollback when a connection is returned) touches nothing.
Savepoints (``begin_nested``) are plain SQL and do run, inside the owner's transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.dialects import registry
from sqlalchemy.dialects.postgresql.psycopg2 import PGDialect_psycopg2
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.pool import NullPool

from celery_ratchet.errors import ConfigurationError
from celery_ratchet.store.engine import same_database
from celery_ratchet.store.units import AfterCommit, Unit

#: The SQLAlchemy driver for each DB-API module a framework may hand over.
_DRIVERS = {
    "psycopg": "postgresql+psycopg",
    "psycopg2": "postgresql+ratchet_lent_psycopg2",
    "MySQLdb": "mysql+mysqldb",
    "pymysql": "mysql+pymysql",
    "sqlite3": "sqlite+pysqlite",
}


class LentPsycopg2Dialect(PGDialect_psycopg2):
    """psycopg2 on a lent connection. The stock dialect registers psycopg2's UUID adapter on
    each new connection, and psycopg2 accepts only its own connection class there, which the
    lent wrapper is not. The owner's connection keeps the adapters its owner gave it; the job
    store binds no UUID values."""

    supports_statement_cache = True

    def on_connect(self) -> None:
        return None


registry.register("postgresql.ratchet_lent_psycopg2", __name__, "LentPsycopg2Dialect")


class _Lent:
    """The owner's DB-API connection, with commit, rollback and close left to the owner."""

    def __init__(self, dbapi_connection: Any) -> None:
        self._dbapi_connection = dbapi_connection

    def commit(self) -> None:
        """The owner commits."""

    def rollback(self) -> None:
        """The owner rolls back."""

    def close(self) -> None:
        """The owner closes."""

    def add_notice_handler(self, *_: Any) -> None:
        # SQLAlchemy's psycopg dialect adds one at every connect: on a connection lent again
        # and again they would pile up on the owner's connection.
        """Notices stay the owner's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dbapi_connection, name)


_lending: ContextVar[_Lent | None] = ContextVar("ratchet_lent_connection", default=None)
_engines: dict[tuple[str, str | None, int | None, str | None], Engine] = {}
_engines_lock = threading.Lock()


def _lent_now() -> _Lent:
    lent = _lending.get()
    if lent is None:  # only lend() connects these engines
        raise RuntimeError("a lent-connection engine was used outside lend()")
    return lent


def driver_of(dbapi_connection: Any) -> str:
    """The SQLAlchemy driver name (``postgresql+psycopg``) of a DB-API connection."""
    module = type(dbapi_connection).__module__.split(".")[0]
    try:
        return _DRIVERS[module]
    except KeyError:
        raise ConfigurationError(
            f"transactional enqueue through a {module} connection is not supported: "
            f"the drivers it works with are {', '.join(sorted(_DRIVERS))}"
        ) from None


def _engine(driver: str, host: str | None, port: int | None, database: str | None) -> Engine:
    key = (driver, host, port, database)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            url = URL.create(driver, host=host, port=port, database=database)
            options: dict[str, Any] = {}
            if driver.startswith("postgresql"):
                # No hstore lookup: it wants the driver's own connection class, and the job
                # store has no hstore column.
                options["use_native_hstore"] = False
            engine = _engines[key] = create_engine(
                url,
                creator=_lent_now,
                # A fresh record per lend: the pool never keeps the owner's connection.
                poolclass=NullPool,
                hide_parameters=True,
                **options,
            )
        return engine


@contextmanager
def lend(
    dbapi_connection: Any,
    *,
    host: str | None,
    port: int | None,
    database: str | None,
    described_as: str,
    remedy: str,
    after_commit: AfterCommit | None = None,
) -> Iterator[Unit]:
    """A unit of work on ``dbapi_connection``, in its owner's transaction.

    ``host``, ``port`` and ``database`` say where that connection goes (the job store checks
    that it is its own database); ``described_as`` and ``remedy`` name the connection and what
    to do in the error raised when it is another database; ``after_commit`` runs a function
    at the owner's commit (Django's ``on_commit``)."""
    engine = _engine(driver_of(dbapi_connection), host, port, database)
    token = _lending.set(_Lent(dbapi_connection))
    try:
        conn = engine.connect()
    finally:
        _lending.reset(token)
    conn.info["ratchet_described_as"] = described_as
    conn.info["ratchet_remedy"] = remedy
    try:
        yield Unit(conn, after_commit)
    finally:
        conn.close()


def reaches_store(
    store: Any, *, vendor: str, host: str | None, port: int | None, database: str | None
) -> bool:
    """Whether a ``vendor`` connection to ``host:port/database`` reaches the database of the
    job store ``store``."""
    other = URL.create(vendor, host=host, port=port, database=database)
    return same_database(store.engine.url, other)


def url_reaches(
    url: str, *, vendor: str, host: str | None, port: int | None, database: str | None
) -> bool:
    """Whether the job store URL ``url`` reaches a ``vendor`` database at
    ``host:port/database`` (another process's connection settings, Django's)."""
    return same_database(make_url(url), URL.create(vendor, host=host, port=port, database=database))


#: The database kinds a job store can be, by the vendor name Django (and SQLAlchemy) give.
_STORE_KINDS = {"postgresql": "postgresql", "mysql": "mysql", "sqlite": "sqlite"}


def url_of_database(
    vendor: str,
    *,
    user: str | None,
    password: str | None,
    host: str | None,
    port: int | None,
    database: str | None,
    options: dict[str, Any] | None = None,
) -> str:
    """The job store URL of a database another framework names by its parts (Django's
    ``DATABASES`` entry): the same server, database, user and password. A host that is a
    directory is a Unix socket's (PostgreSQL); string options go along as URL parameters."""
    kind = _STORE_KINDS.get(vendor)
    if kind is None:
        raise ConfigurationError(
            f"a {vendor} database cannot be the job store: use PostgreSQL, MySQL/MariaDB or SQLite"
        )
    if kind == "sqlite":
        if not database or database == ":memory:" or str(database).startswith("file::memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database cannot be the job store (each connection would "
                "see a database of its own): give the database a file"
            )
        return f"sqlite:///{Path(database).resolve()}"
    query = {k: v for k, v in (options or {}).items() if isinstance(v, str)}
    if host and host.startswith("/"):
        query["host"], host = host, None
    url = URL.create(
        kind, username=user or None, password=password or None, host=host or None,
        port=port, database=database or None, query=query,
    )  # fmt: skip
    return url.render_as_string(hide_password=False)
