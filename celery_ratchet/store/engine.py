"""Engines, connections and the database clock, per dialect.

Every connection runs in autocommit: a single INSERT or UPDATE costs one round trip. Where
several statements must be atomic, :func:`transaction` issues BEGIN/COMMIT itself.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import threading
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, insert
from sqlalchemy.engine import URL, Connection, Engine, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError, PendingRollbackError

from celery_ratchet.errors import (
    ConfigurationError,
)
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store import deadline
from celery_ratchet.store.db_errors import is_read_only
from celery_ratchet.store.packets import read_limit
from celery_ratchet.store.redact import mask_url

logger = logging.getLogger(__name__)

_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "postgres": "postgresql+psycopg",
    "mysql": "mysql+pymysql",
    "mariadb": "mysql+pymysql",
}
_EXTRAS = {"postgresql": "postgres", "mysql": "mysql"}
_FAMILIES = {"postgresql", "mysql", "sqlite"}


def normalize_url(url: str) -> str:
    """Pick the drivers celery_ratchet is tested with when the URL names none."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        raise ConfigurationError(
            f"ratchet_url {mask_url(url)!r} is not a database URL; expected e.g. "
            "postgresql://user@host/db, mysql://user@host/db or sqlite:///path/ratchet.db"
        )
    driver = _DRIVERS.get(scheme, scheme)
    if driver.startswith("postgresql"):
        rest = _host_list_to_query(rest)
    return f"{driver}://{rest}"


def _anchored(url: str) -> str:
    """A SQLite URL with a relative path (``sqlite:///ratchet.db``) made absolute, in the
    working directory of now: SQLite resolves a relative path at each connect, so an engine
    kept for the URL would open a new connection of its pool in whatever directory the
    process has moved to since, and make a new, empty store there."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return url
    database = parsed.database
    if family(parsed.get_backend_name()) != "sqlite" or database in (None, "", ":memory:"):
        return url
    if database.startswith("file:") or Path(database).expanduser().is_absolute():
        return url
    absolute = str(Path(database).expanduser().resolve())
    return parsed.set(database=absolute).render_as_string(hide_password=False)


def _host_list_to_query(rest: str) -> str:
    """libpq's multi-host form ``user@a:5432,b:5433/db`` as ``user@/db?host=a:5432&host=b:5433``,
    the form SQLAlchemy parses (it reads the port of ``a:5432,b:5433`` as one number)."""
    authority, _, tail = rest.partition("/")
    userinfo, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return rest
    path, _, query = tail.partition("?")
    listed = "&".join(f"host={h.strip()}" for h in hosts.split(",") if h.strip())
    query = f"{query}&{listed}" if query else listed
    return f"{userinfo}{at}/{path}?{query}"


def _split_query_hosts(url: URL) -> URL:
    """``?host=a:5432,b:5433`` (one value, comma-separated) as ``?host=a:5432&host=b:5433``."""
    hosts = url.query.get("host")
    if hosts is None:
        return url
    values = (hosts,) if isinstance(hosts, str) else tuple(hosts)
    split = tuple(h.strip() for v in values for h in v.split(",") if h.strip())
    if split == values:
        return url
    return url.update_query_dict({"host": split[0] if len(split) == 1 else split})


def _check_directory(url: str, directory: Path) -> None:
    """A SQLite store's directory must exist: one made here from a mistyped path would hold a
    new, empty store that no worker reads."""
    if not directory.is_dir():
        raise ConfigurationError(
            f"ratchet_url {mask_url(url)}: the directory {directory} does not exist; create it "
            "first (the job store makes the database file, not its directory, so that a "
            "mistyped path does not make a new, empty store)"
        )


def sqlite_file(url: str) -> str | None:
    """The file of a SQLite job-store URL; None for other databases and in-memory ones."""
    try:
        parsed = make_url(normalize_url(url))
    except (ArgumentError, ValueError):
        return None
    if family(parsed.get_backend_name()) != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return parsed.database


def family(dialect_name: str) -> str:
    """``mysql`` for MySQL and MariaDB, else the dialect name."""
    return "mysql" if dialect_name in ("mysql", "mariadb") else dialect_name


#: Names of "this machine": a store at 127.0.0.1 and a connection to localhost are one server.
_LOCAL_HOSTS = {None, "", "localhost", "127.0.0.1", "::1"}
_DEFAULT_PORTS = {"postgresql": 5432, "mysql": 3306}


def _where(url: URL) -> tuple[str, str | None, int | None, str | None]:
    kind = family(url.get_backend_name())
    if kind == "sqlite":
        database = url.database
        if database and database != ":memory:":
            database = str(Path(database).expanduser().resolve())
        return kind, None, None, database
    host = "localhost" if url.host in _LOCAL_HOSTS else url.host
    return kind, host, url.port or _DEFAULT_PORTS.get(kind), url.database


def same_database(a: URL, b: URL) -> bool:
    """Whether two URLs reach the same database: the same kind, server (default ports and
    the names of this machine counted as equal) and database name (SQLite: the same file)."""
    return _where(a) == _where(b)


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()


def _configure_postgres(engine: Engine, display_url: str) -> None:
    """Turn server-side prepared statements off on connections that reach PostgreSQL
    through a pooler (PgBouncer, in any mode) the configuration did not mention: the
    server backend answering a query is then not the one the connection's start-up named
    (a pooler hands out its own backend key). Prepared statements would collide on the
    shared server connections, or be bound to another client's statement. Timestamps no
    Python datetime holds are read as their text (``store/pg_timestamps.py``)."""
    told: list[bool] = []

    @event.listens_for(engine, "connect")
    def _pooler(dbapi_connection: Any, _record: Any) -> None:
        if not hasattr(dbapi_connection, "prepare_threshold"):
            return  # not psycopg 3: nothing is prepared on the server
        served_by = _serving_backend(dbapi_connection, display_url)
        if served_by == dbapi_connection.info.backend_pid:
            return
        dbapi_connection.prepare_threshold = None
        if served_by is not None and not told:
            told.append(True)
            logger.info(
                "ratchet: %s reaches PostgreSQL through a connection pooler (PgBouncer?): "
                "server-side prepared statements are off; set ratchet_pgbouncer = True to "
                "say so, or prepare_threshold in the URL to choose",
                display_url,
            )

    @event.listens_for(engine, "connect")
    def _timestamps(dbapi_connection: Any, _record: Any) -> None:
        if hasattr(dbapi_connection, "adapters"):  # psycopg 3
            from celery_ratchet.store.pg_timestamps import keep_unloadable_timestamps

            keep_unloadable_timestamps(dbapi_connection)


def _serving_backend(dbapi_connection: Any, display_url: str) -> int | None:
    """The pid of the server backend that answers on this new connection; None when the
    question fails (a check that guards an optimisation never refuses the connection)."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SELECT pg_backend_pid()")
        served_by: int = cursor.fetchone()[0]
    except Exception as exc:
        logger.warning(
            "ratchet: %s: whether a connection pooler sits in front of PostgreSQL was not "
            "found out (%s); server-side prepared statements are off on this connection",
            display_url,
            type(exc).__name__,
        )
        return None
    finally:
        cursor.close()
        if not dbapi_connection.autocommit:
            dbapi_connection.rollback()
    return served_by


def _bound_lock_waits(engine: Engine, display_url: str, seconds: float) -> None:
    """``SET lock_timeout`` on each new connection served by the server backend it started
    (not through a pooler, where the setting would stay for another client)."""
    told: list[bool] = []

    @event.listens_for(engine, "connect")
    def _lock_timeout(dbapi_connection: Any, _record: Any) -> None:
        own_pid = getattr(getattr(dbapi_connection, "info", None), "backend_pid", None)
        if own_pid is None or _serving_backend(dbapi_connection, display_url) != own_pid:
            if not told:
                told.append(True)
                logger.info(
                    "ratchet: %s reaches PostgreSQL through a connection pooler (or a driver "
                    "that does not say its backend): outcomes wait on locked job rows as "
                    "long as the locks last",
                    display_url,
                )
            return
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"SET lock_timeout = '{max(1, round(seconds * 1000))}ms'")
        finally:
            cursor.close()


def _probe_dead_peers(sock: Any, seconds: float) -> None:
    """:func:`tcp_probes` on a TCP socket of PyMySQL's, which has no parameters for them."""
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    probes = tcp_probes(seconds)
    options = [
        (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
        (socket.IPPROTO_TCP, "TCP_KEEPIDLE", probes["keepalives_idle"]),
        (socket.IPPROTO_TCP, "TCP_KEEPINTVL", probes["keepalives_interval"]),
        (socket.IPPROTO_TCP, "TCP_KEEPCNT", probes["keepalives_count"]),
        (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", probes["tcp_user_timeout"]),
    ]
    for level, name, value in options:
        if hasattr(socket, name):  # Linux has them all; others some
            sock.setsockopt(level, getattr(socket, name), value)


def _configure_mysql(
    engine: Engine, lock_wait_seconds: float | None = None, tcp_seconds: float | None = None
) -> None:
    @event.listens_for(engine, "connect")
    def _session(dbapi_connection: Any, _record: Any) -> None:
        if tcp_seconds is not None:
            _probe_dead_peers(getattr(dbapi_connection, "_sock", None), tcp_seconds)
        cursor = dbapi_connection.cursor()
        if lock_wait_seconds is not None:  # whole seconds, one at least
            wait = max(1, math.ceil(lock_wait_seconds))
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {wait}")
            cursor.execute(f"SET SESSION lock_wait_timeout = {wait}")  # a table's lock
        # Claims lock exact rows; gap locks under REPEATABLE READ would only add contention.
        cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        cursor.execute("SET SESSION time_zone = '+00:00'")
        # Strict whatever the server's default: a lax sql_mode cuts an over-long id or queue
        # to fit its column (the job would wait in a queue nobody consumes) instead of failing.
        cursor.execute(
            "SET SESSION sql_mode = "
            "CONCAT_WS(',', NULLIF(@@SESSION.sql_mode, ''), 'STRICT_TRANS_TABLES')"
        )
        cursor.close()
        read_limit(engine, dbapi_connection)  # a statement over it is refused before sent


def _drop_read_only(context: ExceptionContext) -> None:
    """A server that refuses writes as read-only (a standby; a primary demoted by a failover
    that left its clients on it; ``default_transaction_read_only`` or ``read_only`` set) is
    treated as a lost connection: the pool drops it and every connection made before it,
    so that the next statement connects anew (to the new primary, where the URL or DNS leads
    there) instead of going on with sessions that stay read-only."""
    if context.original_exception is not None and is_read_only(context.original_exception):
        context.is_disconnect = True


_DEFAULTS = RatchetSettings()


@dataclass(frozen=True)
class EngineOptions:
    """How the job store's connections are made (``ratchet_pool_size``, ``ratchet_max_overflow``,
    ``ratchet_pgbouncer``, ``ratchet_connect_args``), and how long their statements may wait
    for a reply (``ratchet_statement_deadline_seconds``, the heartbeat's settings)."""

    #: Connections each process keeps open, and how many more it may open at a peak.
    pool_size: int = 5
    max_overflow: int = 10
    #: The URL reaches PostgreSQL through PgBouncer (or another pooler) in transaction or
    #: statement mode: no server-side prepared statements, which such a pooler cannot keep.
    pgbouncer: bool = False
    #: Extra keyword arguments of the driver's ``connect()``.
    connect_args: Mapping[str, Any] = field(default_factory=dict)
    #: Each connection waits at most this long on a lock (see :func:`lock_bounded_options`).
    lock_wait_seconds: float | None = None
    #: Every statement's deadline (see store/deadline.py); None: none.
    statement_deadline_seconds: float | None = _DEFAULTS.statement_deadline
    #: A heartbeat's and a registration's.
    liveness_deadline_seconds: float | None = _DEFAULTS.liveness_deadline
    #: TCP keepalives and TCP_USER_TIMEOUT find a dead peer, or a path that stopped
    #: acknowledging, within about this (see :func:`tcp_probes`); None: the system's.
    tcp_timeout_seconds: float | None = _DEFAULTS.liveness_margin

    def key(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, default=repr)


#: psycopg's own connection arguments: not part of a libpq connection string.
_PSYCOPG_ONLY = {"prepare_threshold", "autocommit", "context", "row_factory", "cursor_factory"}


def _prepare_threshold(value: Any) -> int | None:
    """``?prepare_threshold=none`` (never prepare) or ``=5`` in a URL, where it is a string."""
    if value is None or str(value).strip().lower() in {"none", "null", ""}:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ConfigurationError(
            f"prepare_threshold = {value!r} in ratchet_url: expected a whole number of "
            "executions before psycopg prepares a statement, or 'none' to never prepare "
            "(what PgBouncer in transaction mode needs)"
        ) from None


def _timeout(parsed: URL) -> dict[str, Any]:
    """10 s to connect, unless the URL says otherwise (connect arguments win over the URL's:
    a default here would hide ``?connect_timeout=2``, which a multi-host URL wants, as libpq
    waits that long for each host that does not answer)."""
    return {} if "connect_timeout" in parsed.query else {"connect_timeout": 10}


def tcp_probes(seconds: float) -> dict[str, int]:
    """libpq's TCP parameters that find a dead peer in about ``seconds``: keepalive probes
    from half of it on, three of them a sixth of it apart, and sent data left unacknowledged
    for all of it (TCP_USER_TIMEOUT, in milliseconds). Keepalives are answered by a live
    server's kernel however long a statement runs: they never cut a slow statement."""
    return {
        "keepalives": 1,
        "keepalives_idle": max(1, math.ceil(seconds / 2)),
        "keepalives_interval": max(1, math.ceil(seconds / 6)),
        "keepalives_count": 3,
        "tcp_user_timeout": max(1000, round(seconds * 1000)),
    }


def _tcp_defaults(parsed: URL, options: EngineOptions) -> dict[str, Any]:
    """:func:`tcp_probes` for what neither the URL nor the connect arguments set."""
    if options.tcp_timeout_seconds is None:
        return {}
    probes = tcp_probes(options.tcp_timeout_seconds)
    return {k: v for k, v in probes.items() if k not in parsed.query}


def _postgres_connect_args(parsed: URL, options: EngineOptions) -> tuple[URL, dict[str, Any]]:
    connect_args: dict[str, Any] = {
        **_timeout(parsed),
        **_tcp_defaults(parsed, options),
        **options.connect_args,
    }
    if "prepare_threshold" in parsed.query:
        connect_args["prepare_threshold"] = _prepare_threshold(parsed.query["prepare_threshold"])
        parsed = parsed.difference_update_query(["prepare_threshold"])
    elif "prepare_threshold" in connect_args:
        connect_args["prepare_threshold"] = _prepare_threshold(connect_args["prepare_threshold"])
    if options.pgbouncer:
        connect_args["prepare_threshold"] = None
    return _split_query_hosts(parsed), connect_args


def build_engine(url: str, options: EngineOptions | None = None) -> Engine:
    options = options or EngineOptions()
    url = normalize_url(url)
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 - a port that is no number fails here, not at first use
    except (ArgumentError, ValueError) as exc:
        raise ConfigurationError(f"ratchet_url {mask_url(url)!r}: {exc}") from exc
    kind = family(parsed.get_backend_name())
    if kind not in _FAMILIES:
        raise ConfigurationError(
            f"unsupported database {parsed.get_backend_name()!r} in ratchet_url "
            f"{mask_url(url)}: the job store runs on PostgreSQL (postgresql://), MySQL or "
            "MariaDB (mysql://, mariadb://) and SQLite (sqlite:///path)"
        )
    engine_options: dict[str, Any] = {
        "isolation_level": "AUTOCOMMIT",
        # Autocommit connections hold no transaction when returned; a reset ROLLBACK would
        # cost a round trip on every checkout.
        "pool_reset_on_return": None,
        # A statement's parameters are job arguments: never in an error message or a log.
        "hide_parameters": True,
    }
    if kind == "sqlite":
        database = parsed.database
        if database and database != ":memory:":
            _check_directory(url, Path(database).expanduser().resolve().parent)
        engine_options["connect_args"] = {
            "check_same_thread": False,
            "timeout": 30,
            **options.connect_args,
        }
    else:
        engine_options.update(
            pool_size=options.pool_size,
            max_overflow=options.max_overflow,
            pool_recycle=1800,
            pool_timeout=30,
        )
        if kind == "postgresql":
            parsed, engine_options["connect_args"] = _postgres_connect_args(parsed, options)
        elif kind == "mysql":
            # A write the server does not take in for a whole deadline fails: PyMySQL's
            # read_timeout is left unset, as it would also end a long schema change (the
            # statement deadline exempts those).
            write = options.statement_deadline_seconds
            engine_options["connect_args"] = {
                **_timeout(parsed),
                "charset": "utf8mb4",
                **({"write_timeout": math.ceil(write)} if write else {}),
                **options.connect_args,
            }
    try:
        engine = create_engine(parsed, **engine_options)
    except (NoSuchModuleError, ImportError) as exc:
        raise ConfigurationError(
            f"no driver for {parsed.get_backend_name()}: install celery-ratchet[{_EXTRAS[kind]}] "
            f"({exc})"
        ) from exc
    if kind == "sqlite":
        _configure_sqlite(engine)
        return engine
    event.listen(engine, "handle_error", _drop_read_only)
    _bound_statements(engine, options, mask_url(url))
    if kind == "mysql":
        _configure_mysql(engine, options.lock_wait_seconds, options.tcp_timeout_seconds)
    elif kind == "postgresql":
        if "prepare_threshold" not in engine_options["connect_args"]:
            _configure_postgres(engine, mask_url(url))
        if options.lock_wait_seconds is not None:
            _bound_lock_waits(engine, mask_url(url), options.lock_wait_seconds)
    return engine


#: By pool: an engine with other execution options shares its engine's pool.
_statement_bounds: weakref.WeakKeyDictionary[Any, deadline.Bound] = weakref.WeakKeyDictionary()


def statement_bound(engine: Engine) -> deadline.Bound | None:
    """The deadline of ``engine``'s statements (None: none, SQLite, an engine made elsewhere)."""
    return _statement_bounds.get(engine.pool)


def liveness_bound(engine: Engine, options: EngineOptions) -> deadline.Bound | None:
    """The deadline of a heartbeat or a registration on ``engine``'s connections."""
    seconds = options.liveness_deadline_seconds
    if seconds is None or statement_bound(engine) is None:
        return None
    return deadline.Bound(
        seconds,
        "a heartbeat's deadline: half the margin between ratchet_node_heartbeat_interval_seconds"
        " and ratchet_node_orphan_grace_seconds, at most ratchet_statement_deadline_seconds",
        mask_url(engine.url.render_as_string(hide_password=False)),
    )


def _bound_statements(engine: Engine, options: EngineOptions, display_url: str) -> None:
    """Watch each statement of ``engine`` (store/deadline.py): one with no reply within its
    deadline has its connection shut, as a network that cut it would."""
    seconds = options.statement_deadline_seconds
    if seconds is None:
        return
    bound = deadline.Bound(seconds, "ratchet_statement_deadline_seconds", display_url)
    _statement_bounds[engine.pool] = bound

    @event.listens_for(engine, "before_cursor_execute")
    def _sent(conn: Connection, cursor: Any, *_: Any) -> None:
        deadline.watch(id(cursor), conn.connection.dbapi_connection, deadline.bound_for(bound))

    @event.listens_for(engine, "after_cursor_execute")
    def _answered(_conn: Connection, cursor: Any, *_: Any) -> None:
        deadline.unwatch(id(cursor))

    @event.listens_for(engine, "handle_error")
    def _failed(context: Any) -> None:
        cursor = getattr(context.execution_context, "cursor", None)
        if cursor is not None:
            deadline.unwatch(id(cursor))


_engines: dict[tuple[str, str], Engine] = {}
_engines_lock = threading.Lock()


def lock_bounded_options(kind: str, options: EngineOptions, seconds: float) -> EngineOptions | None:
    """``options`` for a small pool whose connections wait at most ``seconds`` on a lock
    another transaction holds: set once on each connection as it is made, so it costs no
    round trip per statement. None where it cannot be set so: SQLite (one lock for the whole
    database) and PostgreSQL behind PgBouncer (a session setting would stay on a server
    connection other clients get); a pooler the configuration does not mention is found on
    each new connection, which is then left without the limit."""
    if kind == "sqlite" or (kind == "postgresql" and options.pgbouncer):
        return None
    return replace(options, pool_size=1, max_overflow=1, lock_wait_seconds=seconds)


def libpq_conninfo(url: str, options: EngineOptions | None = None) -> str:
    """A PostgreSQL URL as a libpq connection string (for a LISTEN connection): the host list,
    ports and parameters the store's own connections use, taken from the dialect's connect
    arguments (the URL rendered back as text would give libpq ``host=a%3A5432``)."""
    from psycopg.conninfo import make_conninfo

    options = options or EngineOptions()
    try:
        parsed = make_url(normalize_url(url))
    except (ArgumentError, ValueError) as exc:
        raise ConfigurationError(f"ratchet_listen_url {mask_url(url)!r}: {exc}") from exc
    parsed, connect_args = _postgres_connect_args(parsed, options)
    _args, params = parsed.get_dialect()().create_connect_args(parsed)
    merged = {**params, **connect_args}
    kept = {k: str(v) for k, v in merged.items() if k not in _PSYCOPG_ONLY and v is not None}
    return make_conninfo(**kept)


def engine_for(url: str, options: EngineOptions | None = None) -> Engine:
    """One engine (and connection pool) per URL and options per process."""
    options = options or EngineOptions()
    key = (_anchored(normalize_url(url)), options.key())
    global _fork_hook_registered
    with _engines_lock:
        if not _fork_hook_registered and hasattr(os, "register_at_fork"):
            # Registered with the first engine, not at import: importing opens nothing.
            os.register_at_fork(after_in_child=_forget_parent_connections)
            _fork_hook_registered = True
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = build_engine(key[0], options)
        return engine


_fork_hook_registered = False


def _forget_parent_connections() -> None:
    # A forked child must never talk over its parent's sockets: drop them without closing.
    for engine in _engines.values():
        engine.dispose(close=False)


def insert_ignoring_conflicts(dialect: Any, table: Any, key: str | None = None) -> Any:
    """An INSERT (executemany-able) that skips rows whose key is taken, in one statement.

    MySQL has no "do nothing": it sets ``key`` (default: the first primary-key column) to
    itself. Give the unique column that conflicts when it is not the primary key, or an
    auto-increment id would be rewritten."""
    kind = family(dialect.name)
    if kind == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as pg_insert

        return pg_insert(table).on_conflict_do_nothing()
    if kind == "mysql":
        from sqlalchemy.dialects.mysql import insert as mysql_insert

        stmt = mysql_insert(table)
        first = key or next(iter(table.primary_key.columns)).name
        return stmt.on_duplicate_key_update({first: table.c[first]})
    return insert(table).prefix_with("OR IGNORE")


@contextmanager
def savepoint(conn: Connection, name: str = "ratchet_row") -> Iterator[None]:
    """A savepoint inside an explicit transaction: an error rolls back to it and propagates,
    leaving the transaction usable (PostgreSQL aborts the whole transaction otherwise)."""
    conn.exec_driver_sql(f"SAVEPOINT {name}")
    try:
        yield
    except BaseException:
        if not conn.invalidated:  # a connection lost: its transaction is gone, the error stands
            conn.exec_driver_sql(f"ROLLBACK TO SAVEPOINT {name}")
        raise
    conn.exec_driver_sql(f"RELEASE SAVEPOINT {name}")


@contextmanager
def transaction(conn: Connection) -> Iterator[Connection]:
    """An explicit transaction on an autocommit connection; SQLite takes the write lock at once."""
    begin = "BEGIN IMMEDIATE" if conn.dialect.name == "sqlite" else "BEGIN"
    conn.exec_driver_sql(begin)
    try:
        yield conn
    except BaseException:
        try:
            conn.exec_driver_sql("ROLLBACK")
        except (DBAPIError, PendingRollbackError):  # the connection is gone: the error stands
            conn.invalidate()
        raise
    conn.exec_driver_sql("COMMIT")
