"""Applying ddl/<dialect>.sql by hand yields the schema the code expects."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import text

from celery_ratchet.store.ddl import ddl_file
from celery_ratchet.store.engine import family
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import Servers


def _statements(script: str) -> list[str]:
    body = "\n".join(line for line in script.splitlines() if not line.startswith("--"))
    return [s.strip() for s in body.split(";") if s.strip()]


def test_applied_ddl_file_matches_schema(servers: Servers, dialect: str, tmp_path: Path) -> None:
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path / 'ddl.db'}"
    else:
        base = servers.url(dialect)
        url = base.rsplit("/", 1)[0] + "/" + base.rsplit("/", 1)[1] + "_ddl"
        _recreate_database(base, url)
    store = JobStore(url, create_schema=False)
    try:
        with store.engine.connect() as conn:
            script = ddl_file(family(store.engine.dialect.name)).read_text()
            for statement in _statements(script):
                conn.execute(text(statement))
        assert store.schema_differences() == []
    finally:
        store.engine.dispose()
        if dialect != "sqlite":
            _drop_database(servers.url(dialect), url)


def _admin(admin_url: str, sql: str, name: str) -> None:
    admin = JobStore(admin_url, create_schema=False)
    quote = '"' if admin.family == "postgresql" else "`"
    with admin.engine.connect() as conn:
        conn.execute(text(sql.format(name=f"{quote}{name}{quote}")))


def _recreate_database(admin_url: str, url: str) -> None:
    name = url.rsplit("/", 1)[1]
    _admin(admin_url, "DROP DATABASE IF EXISTS {name}", name)
    _admin(admin_url, "CREATE DATABASE {name}", name)


def _drop_database(admin_url: str, url: str) -> None:
    _admin(admin_url, "DROP DATABASE IF EXISTS {name}", url.rsplit("/", 1)[1])


def test_a_job_table_of_an_earlier_version_gets_the_storage_parameters_it_lacks(
    servers: Servers,
) -> None:
    """PostgreSQL: scheduler_job leaves room in its pages (fillfactor); a table made before
    is given it at the next start (or `ratchet schema apply`, or Django's migration), and
    a value an operator set is kept."""
    store = JobStore(servers.url("postgresql"))
    store.ensure_schema()

    def options() -> dict[str, str]:
        with store.engine.connect() as conn:
            found = conn.execute(
                text("SELECT reloptions FROM pg_class WHERE relname = 'scheduler_job'")
            ).scalar_one()
        return dict(option.split("=", 1) for option in found or ())

    assert options()["fillfactor"] == "70"
    with store.engine.connect() as conn:
        conn.execute(text("ALTER TABLE scheduler_job RESET (fillfactor)"))
    earlier = JobStore(store.url)
    assert "missing storage parameter fillfactor = 70 of scheduler_job" in (
        earlier.schema_differences()
    )
    earlier.ensure_schema()  # what a worker or client does first
    assert earlier.schema_differences() == []
    assert options()["fillfactor"] == "70"

    with store.engine.connect() as conn:
        conn.execute(text("ALTER TABLE scheduler_job SET (fillfactor = 90)"))
    chosen = JobStore(store.url)
    assert chosen.schema_differences() == []
    chosen.ensure_schema()
    assert options()["fillfactor"] == "90"
    with store.engine.connect() as conn:
        conn.execute(text("ALTER TABLE scheduler_job SET (fillfactor = 70)"))
    for opened in (store, earlier, chosen):
        opened.engine.dispose()
