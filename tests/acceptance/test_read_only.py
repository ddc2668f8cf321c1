"""The database turns read-only under a running worker, as when a failover leaves clients on
the demoted primary (PostgreSQL: ``default_transaction_read_only`` set on the database and
its sessions ended, then reset and ended again; MariaDB: ``SET GLOBAL read_only``). The jobs
running then finish while no outcome can be written: each is kept and written once the
database takes writes again, none is handed back to run a second time, and a ``.delay()``
meanwhile raises StoreUnavailable.

Both servers are private ones this test starts (a PostgreSQL cluster, a mariadbd): never the
shared servers.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import psycopg
import pytest
from celery import Celery

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.store.engine import engine_for
from tests.acceptance.conftest import Cluster, _app_on, wait_until
from tests.private_postgres import PrivatePostgres, start_private_postgres
from tests.private_servers import PrivateMariaDB

pytestmark = [pytest.mark.slow, pytest.mark.infra]

JOBS = 12
SECONDS = 3.0
#: Seconds the database stays read-only (at least).
WINDOW_SECONDS = 8.0
SETTINGS = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "30",
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "1",
}


class Switch(Protocol):
    url: str

    def read_only(self, on: bool) -> None: ...


@dataclass
class PostgresSwitch:
    """Database ``postgres`` of a private cluster, made read-only as a failover leaves it:
    the setting, then every session of the database ended (new ones take the setting)."""

    server: PrivatePostgres

    @property
    def url(self) -> str:
        return self.server.url

    def read_only(self, on: bool) -> None:
        setting = "SET default_transaction_read_only = on" if on else "RESET ALL"
        dsn = f"host=127.0.0.1 port={self.server.port} user=postgres dbname=template1"
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE postgres {setting}")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = 'postgres' AND pid <> pg_backend_pid()"
            )


@dataclass
class MariaDBSwitch:
    """A private mariadbd's global ``read_only``: binds its sessions at once."""

    server: PrivateMariaDB

    @property
    def url(self) -> str:
        return self.server.url

    def read_only(self, on: bool) -> None:
        self.server.execute(f"SET GLOBAL read_only = {int(on)}")


@pytest.fixture
def private_mariadb() -> Iterator[PrivateMariaDB]:
    server = PrivateMariaDB()
    try:
        server.start(wait_until)
        yield server
    except Exception:
        print(server.server_log())
        raise
    finally:
        server.destroy()


@pytest.fixture(
    params=[
        ("postgresql", "threads"),
        ("postgresql", "ratchet"),
        ("mysql", "threads"),
        ("mysql", "ratchet"),
    ],
    ids=lambda p: "-".join(p),
)
def switch(request: pytest.FixtureRequest) -> Iterator[tuple[Switch, str]]:
    dialect, pool = request.param
    if dialect == "postgresql":
        server = start_private_postgres()
        try:
            yield PostgresSwitch(server), pool
        finally:
            server.destroy()
    else:
        yield MariaDBSwitch(request.getfixturevalue("private_mariadb")), pool


@pytest.fixture
def switched_app(switch: tuple[Switch, str]) -> Iterator[Celery]:
    url = switch[0].url
    app = next(_app_on(url))
    policy = app.conf.task_publish_retry_policy
    yield app
    app.conf.task_publish_retry_policy = policy
    engine_for(url).dispose()
    ratchet_state(app).reset()


def _runs(run_log: Path) -> tuple[Counter[str], int]:
    """How many times each job started, and how many runs ended."""
    lines = run_log.read_text().splitlines() if run_log.exists() else []
    ends = sum(1 for line in lines if line.endswith(" end"))
    return Counter(line.split()[0] for line in lines if not line.endswith(" end")), ends


def test_a_read_only_window_runs_no_job_twice_and_loses_no_outcome(
    switch: tuple[Switch, str], switched_app: Celery, tmp_path: Path
) -> None:
    server, pool = switch
    store = ratchet_state(switched_app).store
    span = switched_app.tasks["acc.noted_span"]
    keys = [f"j{i}" for i in range(JOBS)]
    results = [span.delay(key, SECONDS) for key in keys]
    run_log = tmp_path / "runs.log"
    cluster = Cluster(server.url, tmp_path)
    cluster.start("w1", pool=pool, concurrency=4, RATCHET_ACCEPTANCE_RUN_LOG=str(run_log),
                  **SETTINGS)  # fmt: skip
    try:
        wait_until(lambda: len(_runs(run_log)[0]) >= 4, 60, "four jobs to start")
        window = time.monotonic()
        server.read_only(True)

        switched_app.conf.task_publish_retry_policy = {"max_retries": 0}
        refused: BaseException | None = None
        try:
            span.delay("refused", 0)
        except Exception as exc:  # asserted at the end, after the runs are counted
            refused = exc

        # The jobs that started before the window end in it: their outcomes wait for the store.
        def ended_in_the_window() -> bool:
            started, ended = _runs(run_log)
            return ended == sum(started.values())

        wait_until(ended_in_the_window, 60, "the running jobs to end while read-only")
        in_window = sum(_runs(run_log)[0].values())
        wait_until(
            lambda: "read-only" in cluster.whole_logs().lower(),
            30,
            "the worker to meet the read-only store",
        )
        # Not synchronisation: how long the window lasts, so that it spans several
        # heartbeats (1 s) and writes of the outcomes kept.
        time.sleep(max(0.0, WINDOW_SECONDS - (time.monotonic() - window)))
        server.read_only(False)
        window = time.monotonic() - window

        wait_until(
            lambda: store.count_by_status().get("SUCCEEDED", 0) == JOBS,
            120,
            "every job to succeed",
        )
        assert [r.get(timeout=30) for r in results] == keys
    except Exception:
        print(cluster.whole_logs()[-20000:])
        raise
    finally:
        cluster.stop_all()
    started, _ = _runs(run_log)
    twice = sorted(k for k, n in started.items() if n > 1)
    print(
        f"\n[read-only {server.url.split(':')[0]} -P {pool}] {JOBS} jobs of {SECONDS:.0f} s, "
        f"read-only {window:.1f} s with {in_window} running; ran twice: {len(twice)} {twice}; "
        f"statuses {store.count_by_status()}"
    )
    assert isinstance(refused, StoreUnavailable), f"a send in the window: {refused!r}"
    # (Its outcome may be called unknown: the connection it first tried was one the switch
    # ended, and a statement sent on a connection lost may have been committed.)
    assert "is read-only" in str(refused), refused
    assert set(started) == set(keys), "a job never ran, or the refused send ran"
    assert not twice, f"{len(twice)} of {JOBS} jobs ran twice: {twice}"
    assert store.count_by_status() == {"SUCCEEDED": JOBS}
