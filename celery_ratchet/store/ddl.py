"""Render the schema as plain SQL per dialect.

``ddl/<dialect>.sql`` is this output, checked in; ``create_schema`` executes the very same
statements, so the shipped files and what the code creates cannot drift apart.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Index, Table, create_mock_engine, func, inspect, select, text
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError, IntegrityError
from sqlalchemy.schema import CreateColumn, CreateIndex, CreateTable

from celery_ratchet.errors import SchemaNotCreated, SchemaOutdated, StoreBusy
from celery_ratchet.store.db_errors import sqlstate_of
from celery_ratchet.store.engine import family, transaction
from celery_ratchet.store.schema import (
    ACTIVE_KEY_INDEX,
    ACTIVE_KEY_WHERE,
    MYSQL_ACTIVE_KEY_COLUMN,
    MYSQL_ACTIVE_KEY_DEFINITION,
    metadata,
    scheduler_job,
)

#: Dialect name → URL prefix used to render DDL without a live database.
DIALECTS = {
    "postgresql": "postgresql+psycopg://",
    "mysql": "mysql+pymysql://",
    "sqlite": "sqlite://",
}

HEADER = (
    "-- celery_ratchet schema for {dialect}. Generated from celery_ratchet/store/schema.py;\n"
    "-- `ratchet schema show --dialect {dialect}` prints it. Do not edit by hand.\n"
)


logger = logging.getLogger(__name__)


def _dialect(name: str) -> Dialect:
    try:
        url = DIALECTS["mysql" if name == "mariadb" else name]
    except KeyError:
        raise ValueError(f"unknown dialect {name!r}; choose one of {sorted(DIALECTS)}") from None
    return create_mock_engine(url, lambda *a, **k: None).dialect


def index_applies(index: Index, dialect_name: str) -> bool:
    wanted = index.info.get("dialects")
    family = "mysql" if dialect_name == "mariadb" else dialect_name
    return wanted is None or family in wanted


def _clean(sql: str) -> str:
    return "\n".join(line.rstrip() for line in sql.strip().splitlines())


def _table_options(table: Table, dialect: Dialect) -> str:
    """What follows CREATE TABLE's closing parenthesis, from ``table.info``: MySQL's engine,
    charset and collation; PostgreSQL's ``WITH (name = value, ...)`` storage parameters."""
    if family(dialect.name) == "mysql":
        return str(table.info.get("mysql_options", ""))
    options = table.info.get("postgresql_with")
    if not options or dialect.name != "postgresql":
        return ""
    return "\n WITH (" + ", ".join(f"{name} = {value}" for name, value in options.items()) + ")"


def _active_key_index_mysql() -> str:
    return f"CREATE UNIQUE INDEX {ACTIVE_KEY_INDEX} ON scheduler_job ({MYSQL_ACTIVE_KEY_COLUMN})"


def table_statements(table: Table, dialect: Dialect) -> list[str]:
    create = _clean(str(CreateTable(table).compile(dialect=dialect)))
    mysql_active_key = table is scheduler_job and family(dialect.name) == "mysql"
    if mysql_active_key:
        primary_key = "\n\tPRIMARY KEY (id)"
        create = create.replace(primary_key, f"\n\t{MYSQL_ACTIVE_KEY_DEFINITION},{primary_key}")
    statements = [create + _table_options(table, dialect)]
    for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
        if index_applies(index, dialect.name):
            statements.append(_clean(str(CreateIndex(index).compile(dialect=dialect))))
    if mysql_active_key:
        statements.append(_active_key_index_mysql())
    return statements


def ddl_statements(dialect_name: str) -> list[str]:
    """CREATE statements for every table and its indexes, in a stable order."""
    dialect = _dialect(dialect_name)
    statements: list[str] = []
    for table in metadata.sorted_tables:
        statements.extend(table_statements(table, dialect))
    return statements


def ddl_script(dialect_name: str) -> str:
    body = ";\n\n".join(ddl_statements(dialect_name))
    return HEADER.format(dialect=dialect_name) + "\n" + body + ";\n"


def ddl_file(dialect_name: str, root: Path | None = None) -> Path:
    root = root or Path(__file__).resolve().parents[2] / "ddl"
    return root / f"{dialect_name}.sql"


def create_missing_tables(conn: Connection, existing: set[str]) -> list[str]:
    """Create each table not in ``existing`` with its indexes; return the names created."""
    created = []
    for table in metadata.sorted_tables:
        if table.name in existing:
            continue
        for statement in table_statements(table, conn.dialect):
            conn.exec_driver_sql(statement)
        created.append(table.name)
    return created


def add_missing_columns(conn: Connection, *, wait_for_unique_keys: bool = False) -> list[str]:
    """Bring tables made by an earlier celery_ratchet up to date where that is only additive:
    add each missing nullable column, each missing index and each storage parameter a
    PostgreSQL table lacks (:func:`add_storage_parameters`). Returns what was added; a
    missing column that cannot be added (NOT NULL without a default) raises SchemaOutdated.

    Active jobs of an earlier version sharing a business key keep the unique index on active
    keys from being made: that raises SchemaOutdated naming them, or with
    ``wait_for_unique_keys`` (a process starting up) is logged and left for a later start,
    so workers still start and run those jobs out."""
    inspector = inspect(conn)
    existing = set(inspector.get_table_names())
    added = []
    for table in metadata.sorted_tables:
        if table.name not in existing:
            continue
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in columns:
                continue
            if not column.nullable and column.server_default is None:
                raise SchemaOutdated(
                    f"table {table.name} lacks column {column.name}, which cannot be added to "
                    "existing rows; apply the new ddl/ by hand (`ratchet schema show`)"
                )
            spec = _clean(str(CreateColumn(column).compile(dialect=conn.dialect)))
            conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {spec}")
            added.append(f"{table.name}.{column.name}")
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
            if index_applies(index, conn.dialect.name) and index.name not in indexes:
                statement = _clean(str(CreateIndex(index).compile(dialect=conn.dialect)))
                if index.name == ACTIVE_KEY_INDEX:
                    if not _add_active_key_index(conn, [statement], wait_for_unique_keys):
                        continue
                else:
                    conn.exec_driver_sql(statement)
                added.append(f"index {index.name}")
        if table is scheduler_job and family(conn.dialect.name) == "mysql":
            added += _add_mysql_active_key(conn, columns, indexes, wait_for_unique_keys)
    return added + add_storage_parameters(conn)


def missing_storage_parameters(conn: Connection) -> list[tuple[str, str, str]]:
    """PostgreSQL: (table, parameter, value) of each storage parameter of the schema (its
    ``postgresql_with``) that a table lacks, made by an earlier version. A parameter the
    table has, whatever its value, is left as it is: an operator may have chosen it."""
    if conn.dialect.name != "postgresql":
        return []
    wanted = {t.name: t.info["postgresql_with"] for t in metadata.sorted_tables
              if t.info.get("postgresql_with")}  # fmt: skip
    rows = conn.exec_driver_sql(
        "SELECT relname, reloptions FROM pg_class WHERE relkind IN ('r', 'p') "
        "AND relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = current_schema()) "
        "AND relname = ANY(%(names)s)",
        {"names": list(wanted)},
    ).all()
    missing = []
    for table, options in rows:
        present = {str(option).split("=", 1)[0] for option in options or ()}
        missing += [(table, name, value) for name, value in wanted[table].items()
                    if name not in present]  # fmt: skip
    return missing


def add_storage_parameters(conn: Connection) -> list[str]:
    """Give tables an earlier version made the storage parameters they lack. A parameter
    changes no row: it takes a lock that reads and writes do not wait for (nor wait on),
    and applies to pages filled from then on."""
    added = []
    for table, name, value in missing_storage_parameters(conn):
        conn.exec_driver_sql(f"ALTER TABLE {table} SET ({name} = {value})")
        added.append(f"{table} ({name} = {value})")
    return added


def _add_mysql_active_key(
    conn: Connection, columns: set[str], indexes: set[str | None], wait: bool
) -> list[str]:
    statements, added = [], []
    if MYSQL_ACTIVE_KEY_COLUMN not in columns:
        statements.append(f"ALTER TABLE scheduler_job ADD COLUMN {MYSQL_ACTIVE_KEY_DEFINITION}")
        added.append(f"scheduler_job.{MYSQL_ACTIVE_KEY_COLUMN}")
    if ACTIVE_KEY_INDEX not in indexes:
        statements.append(_active_key_index_mysql())
        added.append(f"index {ACTIVE_KEY_INDEX}")
    if statements and not _add_active_key_index(conn, statements, wait):
        return []
    return added


def _add_active_key_index(conn: Connection, statements: list[str], wait: bool) -> bool:
    """Make business keys unique among active jobs in a table an earlier version filled,
    where two active jobs may hold one key: then say which, instead of a driver error (with
    ``wait``, as a warning, and return False: made at a later start)."""
    try:
        _refuse_duplicate_keys(conn)
    except SchemaOutdated as exc:
        if not wait:
            raise
        logger.warning(
            "ratchet: %s. Until then jobs without a business key are sent and run as "
            "always; a send with a business key is refused (SchemaOutdated)",
            exc,
        )
        return False
    try:
        for statement in statements:
            conn.exec_driver_sql(statement)
    except IntegrityError as exc:  # a duplicate written by an older process meanwhile
        _refuse_duplicate_keys(conn)
        raise SchemaOutdated(
            _DUPLICATE_KEYS.format(jobs="(written just now)", index=ACTIVE_KEY_INDEX)
        ) from exc
    return True


_DUPLICATE_KEYS = (
    "business keys must be unique among active jobs, but some are each held by more than one "
    "PENDING, WAITING or RUNNING job {jobs}; the unique index {index} was not created. "
    "Cancel the extra jobs (`ratchet jobs cancel JOB_ID ...`; `ratchet jobs --key KEY` "
    "lists a key's jobs) or let them finish, then start again or run `ratchet schema apply`"
)


def _refuse_duplicate_keys(conn: Connection) -> None:
    job = scheduler_job
    active = text(ACTIVE_KEY_WHERE)
    keys = list(
        conn.execute(
            select(job.c.business_key)
            .where(active)
            .group_by(job.c.business_key)
            .having(func.count() > 1)
            .limit(5)
        ).scalars()
    )
    duplicates: Iterable[str] = (
        conn.execute(
            select(job.c.job_id)
            .where(active, job.c.business_key.in_(keys))
            .order_by(job.c.id)
            .limit(10)
        ).scalars()
        if keys
        else []
    )
    shown = ", ".join(repr(job_id) for job_id in duplicates)
    if shown:
        raise SchemaOutdated(
            _DUPLICATE_KEYS.format(jobs=f"(among them jobs {shown})", index=ACTIVE_KEY_INDEX)
        )


def schema_differences(conn: Connection) -> list[str]:
    """What the live database lacks of the schema: tables, columns, indexes, PostgreSQL's
    storage parameters."""
    inspector = inspect(conn)
    existing = set(inspector.get_table_names())
    problems = []
    for table in metadata.sorted_tables:
        if table.name not in existing:
            problems.append(f"missing table {table.name}")
            continue
        columns = {c["name"] for c in inspector.get_columns(table.name)}
        problems += [
            f"missing column {table.name}.{c.name}" for c in table.columns if c.name not in columns
        ]
        indexes = {i["name"] for i in inspector.get_indexes(table.name)}
        indexes |= {u["name"] for u in inspector.get_unique_constraints(table.name)}
        problems += [
            f"missing index {ix.name} on {table.name}"
            for ix in table.indexes
            if index_applies(ix, conn.dialect.name) and ix.name not in indexes
        ]
        if table is scheduler_job and family(conn.dialect.name) == "mysql":
            if MYSQL_ACTIVE_KEY_COLUMN not in columns:
                problems.append(f"missing column {table.name}.{MYSQL_ACTIVE_KEY_COLUMN}")
            if ACTIVE_KEY_INDEX not in indexes:
                problems.append(f"missing index {ACTIVE_KEY_INDEX} on {table.name}")
    problems += [
        f"missing storage parameter {name} = {value} of {table}"
        for table, name, value in missing_storage_parameters(conn)
    ]
    return problems


def index_shapes(conn: Connection) -> tuple[list[str], list[str]]:
    """Indexes found under the schema's names but not as this version makes them: problems
    (an invalid index, which the planner never uses: a ``CREATE INDEX CONCURRENTLY`` that
    failed) and notes (an index of every row where this version's is partial: a database
    made by an earlier version, which works as it is). PostgreSQL and SQLite; MySQL and
    MariaDB have neither partial nor invalid indexes."""
    kind = family(conn.dialect.name)
    if kind == "mysql":
        return [], []
    expected: dict[str, tuple[str, bool]] = {
        str(ix.name): (table.name, ix.dialect_options[kind].get("where") is not None)
        for table in metadata.sorted_tables
        for ix in table.indexes
        if index_applies(ix, kind)
    }
    problems, notes = [], []
    for name, table, valid, partial in _live_indexes(conn, kind):
        if name not in expected or expected[name][0] != table:
            continue
        if not valid:
            problems.append(
                f"invalid index {name} on {table}: queries do not use it (a CREATE INDEX "
                f"CONCURRENTLY that failed); drop it and create it again"
            )
        elif expected[name][1] and not partial:
            notes.append(
                f"index {name} on {table} holds every row; this version's holds only the "
                "rows its lookups ask for (smaller, cheaper to write): the README's upgrade "
                "steps swap it without a lock"
            )
    return problems, notes


def _live_indexes(conn: Connection, kind: str) -> list[tuple[str, str, bool, bool]]:
    """(index, table, valid, partial) of every index in the connection's schema."""
    if kind == "postgresql":
        rows = conn.exec_driver_sql(
            "SELECT c.relname, t.relname, i.indisvalid, i.indpred IS NOT NULL "
            "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
            "JOIN pg_class t ON t.oid = i.indrelid "
            "WHERE t.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = "
            "current_schema())"
        ).all()
        return [(n, t, bool(v), bool(p)) for n, t, v, p in rows]
    rows = conn.exec_driver_sql(
        "SELECT name, tbl_name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    ).all()
    return [(n, t, True, " WHERE " in " ".join(str(sql).upper().split())) for n, t, sql in rows]


#: PostgreSQL advisory lock key of schema changes ("ratchet" in ASCII); advisory locks are
#: per database, so two databases on one server never wait for each other.
_PG_SCHEMA_LOCK = 0x72617463686574
#: Longest wait for another process's schema change, in seconds.
SCHEMA_LOCK_TIMEOUT = 120


@contextmanager
def schema_lock(conn: Connection) -> Iterator[None]:
    """Hold the database's schema lock: one process at a time creates or alters the tables.

    PostgreSQL: a transaction-level advisory lock, the DDL inside that transaction (all of
    it or none). MySQL/MariaDB: a named lock (``GET_LOCK``) for this database; DDL commits
    itself there. SQLite: ``BEGIN IMMEDIATE``, the write lock of the file."""
    kind = family(conn.dialect.name)
    if kind == "mysql":
        name = "LEFT(CONCAT('ratchet_schema.', DATABASE()), 64)"
        got = conn.exec_driver_sql(f"SELECT GET_LOCK({name}, {SCHEMA_LOCK_TIMEOUT})").scalar()
        if got != 1:
            raise StoreBusy(
                f"another process held the schema lock for {SCHEMA_LOCK_TIMEOUT} s; the "
                "schema was not created (look for a stuck `ratchet schema apply`)"
            )
        try:
            yield
        finally:
            conn.exec_driver_sql(f"SELECT RELEASE_LOCK({name})")
        return
    with transaction(conn):
        if kind == "postgresql":
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{SCHEMA_LOCK_TIMEOUT}s'")
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_SCHEMA_LOCK})")
        yield


def _permission_denied(exc: DBAPIError) -> bool:
    orig = exc.orig
    if sqlstate_of(orig) == "42501":  # PostgreSQL insufficient_privilege
        return True
    code = orig.args[0] if orig is not None and orig.args else None
    # MySQL/MariaDB: table access denied, database access denied, privilege missing.
    if code in (1142, 1044, 1227):
        return True
    return "readonly database" in str(orig)  # SQLite: a file this user may not write


def bring_up_to_date(conn: Connection, *, wait_for_unique_keys: bool = False) -> list[str]:
    """Create what the schema lacks, safely beside other processes doing the same at once:
    look without a lock (the usual case: nothing to do), then take the schema lock and look
    again before changing anything. Returns what was created or added.
    ``wait_for_unique_keys``: see :func:`add_missing_columns`."""
    if not schema_differences(conn):
        return []
    dialect = family(conn.dialect.name)
    try:
        with schema_lock(conn):
            created = create_missing_tables(conn, set(inspect(conn).get_table_names()))
            return created + add_missing_columns(conn, wait_for_unique_keys=wait_for_unique_keys)
    except DBAPIError as exc:
        if sqlstate_of(exc.orig) == "55P03":  # PostgreSQL lock_timeout
            raise StoreBusy(
                f"another process held the schema lock for {SCHEMA_LOCK_TIMEOUT} s; the "
                "schema was not created (look for a stuck `ratchet schema apply`)"
            ) from exc
        if not _permission_denied(exc):
            raise
        reason = str(exc.orig).strip().splitlines()[0]
        raise SchemaNotCreated(
            f"the database user may not create celery_ratchet's tables ({reason}): have an "
            f"administrator apply ddl/{dialect}.sql (`ratchet schema show --dialect "
            f"{dialect}` prints it) and grant this user SELECT, INSERT, UPDATE and DELETE on "
            "those tables, then set ratchet_create_schema = False "
            "(env RATCHET_CREATE_SCHEMA=false)"
        ) from exc


def write_ddl_files(root: Path | None = None) -> list[Path]:
    """Regenerate ``ddl/*.sql`` from the schema code: ``python -m celery_ratchet.store.ddl``."""
    written = []
    for dialect in DIALECTS:
        path = ddl_file(dialect, root)
        path.write_text(ddl_script(dialect))
        written.append(path)
    return written


if __name__ == "__main__":
    for written_path in write_ddl_files():
        print(written_path)
