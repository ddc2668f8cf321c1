"""A worker on a database without the ratchet tables, with ``ratchet_create_schema`` off,
stops at its start with one line that says what to do, and no driver traceback or SQL."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from celery_ratchet.errors import SchemaMissing
from celery_ratchet.store.jobstore import JobStore
from tests.conftest import DB_NAME, PG_HOST, Servers

APP = """
from celery_ratchet import Celery

app = Celery("bare")

@app.task
def add(x, y):
    return x + y
"""


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(
    request: pytest.FixtureRequest, servers: Servers, tmp_path: Path
) -> Iterator[str]:
    """A database with no tables, with a password in its URL (PostgreSQL trusts any)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'bare.db'}"
        return
    servers.url("postgresql")  # skips when PostgreSQL is unreachable
    name = f"{DB_NAME}_bare"
    admin = create_engine(f"postgresql+psycopg://{PG_HOST}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    user, _, hostport = PG_HOST.partition("@")
    try:
        yield f"postgresql://{user}:s3cret@{hostport}/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def test_the_advice_fits_a_process_that_creates_no_tables(empty_database: str) -> None:
    store = JobStore(empty_database, create_schema=False)
    try:
        with pytest.raises(SchemaMissing) as raised:
            store.node_schedule_keys()
    finally:
        store.engine.dispose()
    message = str(raised.value)
    assert "`ratchet --url URL schema apply`" in message
    assert "ratchet_create_schema is off" in message
    assert "start a worker once" not in message and "were not read" not in message
    assert "s3cret" not in message


def test_a_worker_without_tables_stops_with_one_line(empty_database: str, tmp_path: Path) -> None:
    (tmp_path / "bare.py").write_text(textwrap.dedent(APP))
    env = {
        **os.environ,
        "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "RATCHET_URL": empty_database,
        "RATCHET_CREATE_SCHEMA": "false",
    }
    done = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "bare", "worker", "-P", "ratchet", "-c", "1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 78, output[-3000:]
    [critical] = [line for line in output.splitlines() if "CRITICAL" in line]
    assert "the worker cannot start: the job store at" in critical
    assert "has no ratchet tables" in critical and "schema apply" in critical
    assert "ratchet_create_schema is off" in critical
    for unwanted in ("Traceback", "SELECT", "scheduler_node", "were not read", "s3cret"):
        assert unwanted not in output, (unwanted, output[-3000:])
