"""Workers and clients starting together on an empty database create one schema, without
an error in any of them (what every fresh deployment does on its first start)."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import inspect, text

from celery_ratchet.domain.job import JobStatus
from celery_ratchet.store.ddl import index_applies
from celery_ratchet.store.engine import engine_for
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import metadata
from tests.acceptance.conftest import ROOT, Worker, wait_until
from tests.conftest import Servers

pytestmark = pytest.mark.slow

WORKERS = 4
CLIENTS = 4
ROUNDS = 5

CLIENT = """
import sys
from tests.acceptance.gated_app import add
print(add.delay(int(sys.argv[1]), 1).id)
"""


@pytest.fixture
def fresh_database(
    servers: Servers, dialect: str, tmp_path: Path
) -> Iterator[Callable[[int], str]]:
    """Makes an empty database per call (a new file, or a new database on the server)."""
    made: list[str] = []

    def make(round_number: int) -> str:
        if dialect == "sqlite":
            url = f"sqlite:///{tmp_path / f'boot{round_number}.db'}"
        else:
            base = servers.url(dialect)
            url = f"{base}_boot{round_number}"
            _admin(base, f"DROP DATABASE IF EXISTS {_quoted(dialect, url)}")
            _admin(base, f"CREATE DATABASE {_quoted(dialect, url)}")
        made.append(url)
        return url

    yield make
    for url in made:
        engine_for(url).dispose()
        if dialect != "sqlite":
            _admin(servers.url(dialect), f"DROP DATABASE IF EXISTS {_quoted(dialect, url)}")


def _quoted(dialect: str, url: str) -> str:
    name = url.rsplit("/", 1)[1]
    return f'"{name}"' if dialect == "postgresql" else f"`{name}`"


def _admin(admin_url: str, sql: str) -> None:
    with engine_for(admin_url).connect() as conn:
        if conn.dialect.name == "postgresql" and sql.startswith("DROP"):
            sql += " WITH (FORCE)"
        conn.execute(text(sql))


def _one_schema(url: str) -> None:
    """Exactly the tables and indexes of the schema: none missing, none twice."""
    engine = engine_for(url)
    with engine.connect() as conn:
        inspector = inspect(conn)
        tables = {t for t in inspector.get_table_names() if t.startswith("scheduler_")}
        assert tables == set(metadata.tables)
        for table in metadata.sorted_tables:
            found = [i["name"] for i in inspector.get_indexes(table.name)]
            found += [u["name"] for u in inspector.get_unique_constraints(table.name)]
            wanted = {str(i.name) for i in table.indexes if index_applies(i, conn.dialect.name)}
            assert wanted <= set(found), (table.name, found)
    assert JobStore(url, create_schema=False).schema_differences() == []


def _start_together(url: str, tmp: Path) -> tuple[list[Worker], list[subprocess.Popen[str]]]:
    gate = tmp / "gate"
    env = {"RATCHET_TEST_START_GATE": str(gate), "RATCHET_URL": url}
    workers = [
        Worker(
            url,
            f"boot{i}",
            tmp / f"boot{i}.log",
            concurrency=1,
            app_module="tests.acceptance.gated_app",
            **env,
        )
        for i in range(WORKERS)
    ]
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(i)],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(CLIENTS)
    ]
    wait_until(
        lambda: len(list(tmp.glob("gate.ready.*"))) == WORKERS + CLIENTS,
        120,
        "every process to import the app",
    )
    gate.touch()
    return workers, clients


def _ran(store: JobStore, workers: list[Worker], sent: list[str], round_number: int) -> bool:
    dead = [w for w in workers if w.process.poll() is not None]
    assert not dead, f"round {round_number}:\n{dead[0].log.read_text()[-3000:]}"
    records = [store.result(job_id) for job_id in sent]
    return all(r is not None and r.status is JobStatus.SUCCEEDED for r in records)


def _nodes(store: JobStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(text("SELECT COUNT(*) FROM scheduler_node")).scalar_one())


def test_workers_and_clients_starting_at_once_create_one_schema(
    fresh_database: Callable[[int], str], tmp_path: Path
) -> None:
    for round_number in range(ROUNDS):
        url = fresh_database(round_number)
        tmp = tmp_path / f"round{round_number}"
        tmp.mkdir()
        workers, clients = _start_together(url, tmp)
        try:
            sent = []
            for client in clients:
                out, err = client.communicate(timeout=120)
                assert client.returncode == 0, f"round {round_number}: a client failed:\n{err}"
                assert "Traceback" not in err and "Error" not in err, err
                sent.append(out.strip())
            store = JobStore(url, create_schema=False)
            ran = functools.partial(_ran, store, workers, sent, round_number)
            wait_until(ran, 120, f"round {round_number}: the clients' jobs to run")
            wait_until(
                lambda s=store: _nodes(s) == WORKERS,
                120,
                f"round {round_number}: each worker's node",
            )
            _one_schema(url)
        finally:
            for worker in workers:
                worker.kill()
        for worker in workers:
            log = worker.log.read_text()
            for bad in ("Traceback", "ERROR", "CRITICAL"):
                assert bad not in log, f"round {round_number}:\n{log[-3000:]}"
