"""What a driver's error means: the database unreachable, a lock conflict worth retrying, a
value refused, a prepared statement taken by another client behind PgBouncer; and the
project's errors that say so without the statement's parameters."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy.engine import Connection
from sqlalchemy.exc import DataError, DBAPIError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from celery_ratchet.errors import (
    ConfigurationError,
    PreparedStatementConflict,
    StatementCancelled,
    StoreBusy,
    StoreFull,
    StorePermissionDenied,
    StoreUnavailable,
    TransactionRolledBack,
    ValueRefused,
)
from celery_ratchet.store.redact import mask_secrets_of, mask_url

logger = logging.getLogger(__name__)


def sqlstate_of(orig: object) -> str | None:
    """The SQLSTATE of a PostgreSQL driver's error: psycopg 3 names it ``sqlstate``, psycopg2
    (a connection lent by Django) ``pgcode``; ``None`` for other drivers."""
    return getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)


def is_unavailable(exc: BaseException) -> bool:
    """True when ``exc`` means the database could not be reached (as opposed to a bad query)."""
    if isinstance(exc, PoolTimeout):
        return True
    if isinstance(exc, DBAPIError):
        if (
            is_prepared_statement_conflict(exc)
            or _is_packet_too_large(exc)
            or is_statement_cancelled(exc)
        ):
            return False
        if exc.connection_invalidated or refused_by_server(exc):
            return True
        if is_missing_table(exc):
            return False
        # By class and its bases: psycopg's ConnectionTimeout is an OperationalError.
        names = {k.__name__ for k in type(exc.orig).__mro__} if exc.orig is not None else set()
        return bool(names & {"OperationalError", "InterfaceError"}) and not _is_lock_error(exc)
    return False


#: PostgreSQL's read_only_sql_transaction: a standby, a primary demoted by a failover (that
#: left clients on it), or ``default_transaction_read_only`` set.
_READ_ONLY_STATES = {"25006"}
#: MySQL/MariaDB: ER_OPTION_PREVENTS_STATEMENT (``--read-only``, ``super_read_only``),
#: ER_CANT_EXECUTE_IN_READ_ONLY_TRANSACTION, ER_READ_ONLY_MODE, ER_INNODB_READ_ONLY.
_READ_ONLY_CODES = {1290, 1792, 1836, 1874}


def is_read_only(exc: BaseException) -> bool:
    """True when the server refused a write because it is read-only: for the store, an
    outage like any other (nothing was written; writes are to be kept and tried again), not
    a refused statement. The connection is on the wrong server, or one that is waiting for
    its role: the engine drops it (see ``engine._drop_read_only``)."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else exc
    if orig is None:
        return False
    if sqlstate_of(orig) in _READ_ONLY_STATES:
        return True
    args = getattr(orig, "args", None) or (None,)
    return isinstance(args[0], int) and args[0] in _READ_ONLY_CODES


#: PostgreSQL's disk_full.
_DISK_FULL_STATES = {"53100"}
#: MySQL/MariaDB: ER_DISK_FULL, ER_RECORD_FILE_FULL ("The table ... is full").
_DISK_FULL_CODES = {1021, 1114}
#: MySQL/MariaDB errors that carry an operating system's errno: ER_ERROR_ON_WRITE,
#: ER_ERROR_ON_RENAME's kin, ER_GET_ERRNO ("Got error 28 from storage engine").
_ERRNO_CODES = {3, 1026, 1030}
_ENOSPC = re.compile(r"\b(?:Errcode|error):? 28\b|No space left on device", re.IGNORECASE)


def is_disk_full(exc: BaseException) -> bool:
    """True when the server refused a statement for want of disk space: nothing of it was
    written (not a lost reply). For the store an outage all the same: what was refused is
    kept and tried again once there is room."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else exc
    if orig is None:
        return False
    if sqlstate_of(orig) in _DISK_FULL_STATES:
        return True
    args = getattr(orig, "args", None) or (None,)
    if not isinstance(args[0], int):
        return False
    return args[0] in _DISK_FULL_CODES or (
        args[0] in _ERRNO_CODES and _ENOSPC.search(str(orig)) is not None
    )


def refused_by_server(exc: BaseException) -> bool:
    """The server answered, refusing the statement for a state of its own (read-only, no
    space left): nothing of it was written, whatever the connection does next."""
    return is_read_only(exc) or is_disk_full(exc)


#: PostgreSQL's insufficient_privilege.
_PERMISSION_STATES = {"42501"}
#: MySQL/MariaDB: ER_TABLEACCESS_DENIED_ERROR ("UPDATE command denied to user ... for table
#: ..."), ER_COLUMNACCESS_DENIED_ERROR, ER_SPECIFIC_ACCESS_DENIED_ERROR,
#: ER_PROCACCESS_DENIED_ERROR.
_PERMISSION_CODES = {1142, 1143, 1227, 1370}
_MYSQL_DENIED = re.compile(
    r"(\w+) command denied to user .*? for table [`'\"]?(?:\w+[`'\"]?\.[`'\"]?)?(\w+)"
)
_PG_DENIED = re.compile(r"permission denied for (table|sequence|schema|relation) \"?(\w+)")
_VERB = re.compile(r"\b(INSERT|UPDATE|DELETE|SELECT)\b", re.IGNORECASE)


def is_permission_denied(exc: BaseException) -> bool:
    """True when the database refused a statement because the job store's user lacks a
    privilege it needs: nothing of it was written, and it is no lost connection."""
    orig = getattr(exc, "orig", None) if isinstance(exc, DBAPIError) else exc
    if orig is None:
        return False
    if sqlstate_of(orig) in _PERMISSION_STATES:
        return True
    args = getattr(orig, "args", None) or (None,)
    return isinstance(args[0], int) and args[0] in _PERMISSION_CODES


def _missing_privilege(exc: BaseException) -> str:
    """``the UPDATE privilege on table scheduler_job``, as far as the error says it: MySQL
    and MariaDB name the command, PostgreSQL the object (the statement says the command)."""
    orig = getattr(exc, "orig", None) or exc
    text = str(orig)
    found = _MYSQL_DENIED.search(text)
    if found:
        return f"the {found.group(1).upper()} privilege on table {found.group(2)}"
    found = _PG_DENIED.search(text)
    if found:
        kind, name = found.groups()
        if kind in ("sequence", "schema"):
            return f"the USAGE privilege on {kind} {name}"
        statement = str(getattr(exc, "statement", "") or "")
        verb = _VERB.search(statement.split("(")[0]) or _VERB.search(statement)
        privilege = f"the {verb.group(1).upper()} privilege" if verb else "a privilege"
        return f"{privilege} on table {name}"
    return "a privilege the statement needs"


def permission_denied(url: str, exc: BaseException, what: str) -> StorePermissionDenied:
    """The error of a statement the store's database user may not run: the privilege and
    the table it lacks, the server's reason, never the statement nor its parameters."""
    orig = getattr(exc, "orig", None) or exc
    args = tuple(getattr(orig, "args", None) or ())
    said = args[1] if len(args) == 2 and isinstance(args[1], str) else str(orig)  # MySQL's
    reason = mask_secrets_of(url, said.strip().splitlines()[0])
    return StorePermissionDenied(
        f"the job store at {mask_url(url)} refused a statement: its database user lacks "
        f"{_missing_privilege(exc)} ({reason}); nothing of it was written. Workers, senders "
        "and a dashboard that acts need SELECT, INSERT, UPDATE and DELETE on the ratchet "
        "tables (and USAGE on their sequences on PostgreSQL); a read-only dashboard needs "
        f"SELECT alone; {what}"
    )


#: MySQL/MariaDB's ER_NET_PACKET_TOO_LARGE: the statement is over ``max_allowed_packet``.
_PACKET_TOO_LARGE = 1153


def _is_packet_too_large(exc: DBAPIError) -> bool:
    """A statement larger than the server takes: a refusal of what was sent, not an outage
    (the server drops the connection too, which would otherwise read as one)."""
    args = getattr(exc.orig, "args", None) or (None,)
    return args[0] == _PACKET_TOO_LARGE


def is_missing_table(exc: BaseException) -> bool:
    """True when ``exc`` says a table does not exist (the schema was never created)."""
    # PostgreSQL undefined_table; MySQL / MariaDB ER_NO_SUCH_TABLE.
    return _missing(exc, "42P01", 1146, "no such table")


def is_missing_column(exc: BaseException) -> bool:
    """True when ``exc`` says a column does not exist (tables of an earlier version)."""
    # PostgreSQL undefined_column; MySQL / MariaDB ER_BAD_FIELD_ERROR.
    return _missing(exc, "42703", 1054, "no such column")


def _missing(exc: BaseException, sqlstate: str, mysql_code: int, sqlite_text: str) -> bool:
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    orig = exc.orig
    if sqlstate_of(orig) == sqlstate:
        return True
    args = getattr(orig, "args", ())
    if args and args[0] == mysql_code:
        return True
    return type(orig).__name__ == "OperationalError" and sqlite_text in str(orig)


#: SQLite's SQLITE_NOTADB: the file at the URL's path is something else (a text file, a
#: database of another program's format).
_SQLITE_NOT_A_DATABASE = 26


def is_not_a_database(exc: BaseException) -> bool:
    """True when the URL names a file SQLite cannot read as a database."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    orig = exc.orig
    if getattr(orig, "sqlite_errorcode", None) == _SQLITE_NOT_A_DATABASE:
        return True
    return type(orig).__module__ == "sqlite3" and "is not a database" in str(orig)


def not_a_database(display_url: str, exc: DBAPIError) -> ConfigurationError:
    reason = str(exc.orig).strip().splitlines()[0]
    return ConfigurationError(
        f"the job store at {display_url} is not a SQLite database ({reason}): check the "
        "path in the URL; `ratchet --url URL schema apply` creates a store at a path where "
        "no file is yet"
    )


def _is_lock_error(exc: DBAPIError) -> bool:
    if sqlstate_of(exc.orig) == "55P03":  # PostgreSQL: lock_timeout ran out
        return True
    text = str(exc.orig).lower()
    return "deadlock" in text or "lock wait timeout" in text or "database is locked" in text


#: PostgreSQL's query_canceled: statement_timeout, or pg_cancel_backend by an operator.
_CANCELLED_STATES = {"57014"}
#: MySQL's ER_QUERY_TIMEOUT (max_execution_time), MariaDB's ER_STATEMENT_TIMEOUT
#: (max_statement_time).
_CANCELLED_CODES = {3024, 1969}


def is_statement_cancelled(exc: BaseException) -> bool:
    """True when the server ended the statement before it finished (a time limit, an
    operator's cancel): neither an outage nor a bad query."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    if sqlstate_of(exc.orig) in _CANCELLED_STATES:
        return True
    args = getattr(exc.orig, "args", None) or (None,)
    return args[0] in _CANCELLED_CODES


def cancelled(exc: DBAPIError, what: str) -> StatementCancelled:
    reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else ""
    return StatementCancelled(
        f"the job store ended a statement before it finished ({reason}); nothing of it was "
        "committed. A limit on statement time for the job store's user (PostgreSQL "
        "statement_timeout, MySQL max_execution_time, MariaDB max_statement_time) ends "
        "statements that wait on locks another client holds on the ratchet tables: raise "
        "or lift it for that user, or find what holds the locks; "
        f"{what}"
    )


def is_retryable_conflict(exc: BaseException) -> bool:
    """Deadlocks and lock timeouts: the statement can simply run again."""
    if not isinstance(exc, DBAPIError):
        return False
    # A deadlock MySQL/MariaDB (and Galera's certification) end by rolling the whole
    # transaction back surfaces as the savepoint that is gone: the deadlock is the error.
    exc = _error_that_ended(exc)
    if _is_lock_error(exc):
        return True
    code = sqlstate_of(exc.orig)
    return code in {"40001", "40P01"}


#: Where drivers quote a value in a message: ``value: '…'`` (MySQL), ``…: "…"`` (PostgreSQL),
#: ``(column)=(…)`` (PostgreSQL's key details).
_QUOTED_VALUE = re.compile(r"""(value:?\s*|:\s*)('[^']*'|"[^"]*")|(=\()[^)]*(\))""", re.I)


def refused(exc: DBAPIError, what: str) -> ValueRefused:
    """A value the database refused, as a :class:`ValueRefused` carrying its reason: the
    first line of the driver's message, with any quoted value in it cut out."""
    reason = str(exc.orig or "").strip().splitlines()[0] if exc.orig is not None else ""
    reason = _QUOTED_VALUE.sub(lambda m: f"{m.group(1) or m.group(3)}…{m.group(4) or ''}", reason)
    return ValueRefused(f"the job store refused a value ({reason or type(exc).__name__}); {what}")


#: SQLite's words for a file it may not open or write (CANTOPEN, READONLY).
_SQLITE_FILE_REASONS = {"unable to open database file", "attempt to write a readonly database"}
_SQLITE_FILE_HINT = (
    "SQLite writes the file and, beside it, its -wal and -shm files: check that the "
    "directory exists and that this user may write the file and the directory"
)


def unavailable(url: str, exc: BaseException, what: str, *, sent: bool = False) -> StoreUnavailable:
    """The error of a store that cannot be reached. ``sent``: the connection was lost after a
    statement went out, so the database may have committed it (a lost reply): say that the
    outcome is unknown instead of claiming ``what``."""
    reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
    reason = mask_secrets_of(url, reason)
    if url.startswith("sqlite") and reason in _SQLITE_FILE_REASONS:
        reason = f"{reason}: {_SQLITE_FILE_HINT}"
    if sent:
        consequence = (
            "the connection was lost after the request was sent, so its outcome is unknown: "
            f"it may have been committed (if it was not, {what})"
        )
    else:
        consequence = what
    kind = StoreUnavailable
    if is_read_only(exc):  # reached, but it takes no writes: the same outage for the store
        where = (
            f"the job store at {mask_url(url)} is read-only ({reason}): a standby, or a "
            "primary demoted by a failover; its connections are dropped, the next try makes "
            "new ones"
        )
    elif is_disk_full(exc):
        kind = StoreFull
        where = (
            f"the job store at {mask_url(url)} has no space left ({reason}): the database "
            "refused the statement and nothing of it was written; free disk space on the "
            "database server"
        )
    else:
        where = f"cannot reach the job store at {mask_url(url)} ({reason})"
    error = kind(f"{where}; {consequence}")
    error.outcome_unknown = sent
    return error


#: Parse, Bind and Describe refused for a statement name: prepared on one server connection,
#: used on another. A pooler in transaction mode hands each transaction any server connection.
_PREPARED_STATEMENT_STATES = {"42P05", "26000", "08P01"}


def is_prepared_statement_conflict(exc: BaseException) -> bool:
    """True when PostgreSQL refused a server-side prepared statement of psycopg (``_pg3_*``)."""
    if not isinstance(exc, DBAPIError) or exc.orig is None:
        return False
    code = sqlstate_of(exc.orig)
    return code in _PREPARED_STATEMENT_STATES and "prepared statement" in str(exc.orig)


def prepared_statement_conflict(exc: BaseException, what: str) -> PreparedStatementConflict:
    orig = getattr(exc, "orig", None)
    code = sqlstate_of(orig)
    return PreparedStatementConflict(
        f"PostgreSQL refused a prepared statement (SQLSTATE {code}, {type(orig).__name__}): the "
        "job store's URL goes through a pooler in transaction mode (PgBouncer), which cannot "
        "keep server-side prepared statements, and may bind one client's parameters to "
        "another's statement; set ratchet_pgbouncer = True (environment RATCHET_PGBOUNCER=true) "
        f"on every process, or add ?prepare_threshold=none to the URL; {what}"
    )


#: The savepoint a rollback went back to is gone: the database ended the whole transaction
#: first (MySQL/MariaDB's 1305; PostgreSQL's invalid savepoint specification).
_NO_SAVEPOINT_CODES = {1305}
_NO_SAVEPOINT_STATES = {"3B001"}


def _hidden(exc: BaseException | None) -> None:
    """Hide the parameters of every statement error in ``exc``'s chain: a traceback prints
    each one, and the caller's engine may not hide them."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DBAPIError):
            exc.hide_parameters = True
        exc = exc.__cause__ or exc.__context__


def _next_statement_error(exc: BaseException) -> DBAPIError | None:
    """The statement error ``exc`` was raised while handling (the driver's own error sits
    between the two)."""
    seen: set[int] = {id(exc)}
    found = exc.__context__
    while found is not None and id(found) not in seen:
        if isinstance(found, DBAPIError):
            return found
        seen.add(id(found))
        found = found.__context__
    return None


def _error_that_ended(exc: DBAPIError) -> DBAPIError:
    """``exc``, or where going back to a savepoint failed (each nested one in turn) because
    the transaction had ended, the error that ended it."""
    while _savepoint_lost(exc) and (ended := _next_statement_error(exc)) is not None:
        exc = ended
    return exc


def _savepoint_lost(exc: DBAPIError) -> bool:
    args = getattr(exc.orig, "args", None) or (None,)
    return sqlstate_of(exc.orig) in _NO_SAVEPOINT_STATES or args[0] in _NO_SAVEPOINT_CODES


_ROLLED_BACK = (
    "the database rolled your whole transaction back ({reason}): nothing written in it "
    "stands, this send included; run the transaction again"
)


@contextmanager
def in_callers_transaction(conn: Connection, what: str, *, callers: bool = True) -> Iterator[None]:
    """Statements on a caller's connection, inside its transaction (a savepoint each): a
    driver error leaves as the store's error for it. No retry is possible there, and the
    caller's engine may show a statement's parameters (job arguments, business keys) in its
    errors: they are hidden, in the error raised and in every error chained to it.
    ``callers`` False: the store's own transaction, whose errors reach its own retry as
    they are (its engine hides parameters)."""
    if not callers:
        yield
        return
    try:
        yield
    except DBAPIError as raised:
        _hidden(raised)
        # Going back to a savepoint failed: the error that ended the transaction is the one
        # to tell.
        exc = _error_that_ended(raised)
        rolled_back = exc is not raised
        if is_prepared_statement_conflict(exc):
            raise prepared_statement_conflict(exc, what) from exc
        if is_statement_cancelled(exc):
            raise cancelled(exc, what) from exc
        if is_retryable_conflict(exc):
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else ""
            if rolled_back:
                raise TransactionRolledBack(
                    f"{_ROLLED_BACK.format(reason=reason)}; {what}"
                ) from exc
            raise StoreBusy(
                "the job store waited on a lock another transaction holds (an uncommitted send "
                "of the same business key, a long transaction on the ratchet tables) until the "
                "database's lock wait limit (PostgreSQL lock_timeout, MySQL/MariaDB "
                "innodb_lock_wait_timeout), or was chosen to end a deadlock; nothing of this "
                "send was written, and your transaction goes on without it. Send again once "
                f"the other transaction has ended, or raise the limit; {what}"
            ) from exc
        if is_permission_denied(exc) and not rolled_back:
            url = conn.engine.url.render_as_string(hide_password=False)
            raise permission_denied(
                url, exc, f"{what}; your transaction goes on without it"
            ) from exc
        if is_disk_full(exc) and not rolled_back:
            url = conn.engine.url.render_as_string(hide_password=False)
            raise unavailable(url, exc, f"{what}; your transaction goes on without it") from exc
        if is_unavailable(exc):
            url = conn.engine.url.render_as_string(hide_password=False)
            raise unavailable(
                url,
                exc,
                f"{what}: your transaction was on that connection, and the database ended it "
                "with the connection, so nothing written in it was committed",
            ) from exc
        if isinstance(exc, DataError):
            raise refused(exc, what) from exc
        if rolled_back:
            reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else ""
            raise TransactionRolledBack(f"{_ROLLED_BACK.format(reason=reason)}; {what}") from exc
        raise
