"""Render the schema as plain SQL per dialect.

``ddl/<dialect>.sql`` is this output, checked in; ``create_schema`` executes the very same
statements, so the shipped files and what the code creates cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Index, Table, create_mock_engine
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.schema import CreateIndex, CreateTable

from celery_ratchet.store.schema import metadata

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


def table_statements(table: Table, dialect: Dialect) -> list[str]:
    statements = [_clean(str(CreateTable(table).compile(dialect=dialect)))]
    for index in sorted(table.indexes, key=lambda ix: str(ix.name)):
        if index_applies(index, dialect.name):
            statements.append(_clean(str(CreateIndex(index).compile(dialect=dialect))))
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
