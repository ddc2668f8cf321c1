"""A PostgreSQL that ends idle sessions (``idle_session_timeout``, as managed services and
poolers set it): the worker's LISTEN connection waits idle between notifications, and must
not be ended over and over, or enqueues made meanwhile wake nobody."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.events.postgres import APPLICATION_NAME
from celery_ratchet.store.engine import engine_for
from tests.acceptance.conftest import Cluster, _app_on, wait_until
from tests.conftest import PG_HOST, Servers

pytestmark = pytest.mark.slow

#: Without a wake-up, an idle worker would look for new jobs this seldom (seconds).
AN_HOUR = {"RATCHET_POLL_INTERVAL": "3600", "RATCHET_WAKEUP_POLL_INTERVAL": "3600"}


@pytest.fixture
def idle_ending_url(servers: Servers) -> Iterator[str]:
    """A database of this test's own whose sessions end after 2 s idle (set on the database
    alone: the shared server's settings stay as they are)."""
    servers.url("postgresql")  # skipped, or failed under CI, when PostgreSQL is away
    name = f"ratchet_idle_{os.getpid()}"
    admin = create_engine(f"postgresql+psycopg://{PG_HOST}/postgres", isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
        conn.execute(text(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '2s'"))
    url = f"postgresql://{PG_HOST}/{name}"
    try:
        yield url
    finally:
        engine_for(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _listener(url: str) -> tuple[int, float] | None:
    """The LISTEN connection's backend pid and age (seconds), if it is connected."""
    with engine_for(url).connect() as conn:
        row = conn.execute(
            text(
                "SELECT pid, EXTRACT(EPOCH FROM now() - backend_start) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = :name"
            ),
            {"name": APPLICATION_NAME},
        ).first()
    return None if row is None else (int(row[0]), float(row[1]))


def test_the_listen_connection_outlives_the_idle_session_timeout_and_wakes_the_worker(
    idle_ending_url: str, tmp_path: Path
) -> None:
    app = next(_app_on(idle_ending_url))
    double = app.tasks["acc.double"]
    store = ratchet_state(app).store
    cluster = Cluster(idle_ending_url, tmp_path)
    worker = cluster.start("w1", concurrency=2, **AN_HOUR)
    try:
        wait_until(lambda: len(store.list_nodes()) == 1, 60, "the worker registered")
        # Idle far past the server's 2 s: the same session, never ended and made again.
        wait_until(
            lambda: (found := _listener(idle_ending_url)) is not None and found[1] > 6,
            60,
            "the LISTEN connection idle past the timeout three times over",
        )
        first = _listener(idle_ending_url)
        # Found by a wake-up only: the worker's next look of its own is an hour away.
        assert double.delay(21).get(timeout=60) == 42
        assert _listener(idle_ending_url) is not None
        assert _listener(idle_ending_url)[0] == first[0]  # type: ignore[index]
    except Exception:
        print(cluster.logs())
        raise
    finally:
        cluster.stop_all()
    assert "wake-ups lost" not in worker.log.read_text()
