"""The job store behind PgBouncer in transaction pooling mode (pool size 5), the way
PostgreSQL is run at scale: three worker processes drain 2,000 jobs sent one ``.delay()`` at a
time, every job runs exactly once, results are readable, a per-second schedule fires once per
tick and a chord's body runs once. With ``ratchet_pgbouncer`` psycopg prepares nothing on the
server; without it, the conflicts PgBouncer causes are a clear error, not a raw driver one.

PgBouncer is a private one this test starts on a free port, in front of the run's own
database on the shared PostgreSQL server.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, chord
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import PreparedStatementConflict
from celery_ratchet.events.postgres import PostgresWakeups
from celery_ratchet.store.engine import EngineOptions, build_engine, engine_for, libpq_conninfo
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import (
    Cluster,
    _app_on,
    assert_every_tick_once,
    side_effects,
    ticks,
    wait_until,
)
from tests.conftest import Servers
from tests.helpers import listening, new_job
from tests.private_servers import PrivatePgBouncer

pytestmark = [pytest.mark.slow, pytest.mark.infra]

JOBS = 2000
CHORD_CHILDREN = 50


@pytest.fixture
def direct_url(servers: Servers) -> str:
    return servers.url("postgresql")


@pytest.fixture
def bouncer(direct_url: str) -> Iterator[PrivatePgBouncer]:
    database = direct_url.rpartition("/")[2]
    port = int(direct_url.rpartition("@")[2].partition("/")[0].rpartition(":")[2])
    found = PrivatePgBouncer(port, database, pool_mode="transaction", pool_size=5)
    try:
        found.start()
        yield found
    finally:
        found.destroy()


@pytest.fixture
def bounced_app(direct_url: str, bouncer: PrivatePgBouncer) -> Iterator[Celery]:
    """The acceptance app sending through PgBouncer; its tables made on the direct URL."""
    app = next(_app_on(direct_url))
    app.conf.ratchet_url = bouncer.url
    app.conf.ratchet_pgbouncer = True
    app.conf.ratchet_listen_url = direct_url
    ratchet_state(app).reset()
    yield app
    ratchet_state(app).store.engine.dispose()
    app.conf.ratchet_url = direct_url
    app.conf.ratchet_pgbouncer = False
    app.conf.ratchet_listen_url = None
    ratchet_state(app).reset()


def test_three_workers_behind_pgbouncer_run_every_job_once(
    bounced_app: Celery, bouncer: PrivatePgBouncer, direct_url: str, tmp_path: Path
) -> None:
    store = ratchet_state(bounced_app).store
    run_log = tmp_path / "runs.log"
    cluster = Cluster(bouncer.url, tmp_path)
    env = {
        "RATCHET_PGBOUNCER": "true",
        "RATCHET_LISTEN_URL": direct_url,
        "RATCHET_ACCEPTANCE_RECURRING": "tick",
        "RATCHET_ACCEPTANCE_RUN_LOG": str(run_log),
    }
    noted = bounced_app.tasks["acc.noted_sleep"]
    value, body = bounced_app.tasks["acc.value"], bounced_app.tasks["acc.chord_body"]
    chord_key = f"chord-{uuid.uuid4().hex[:8]}"
    try:
        for name in ("b1", "b2", "b3"):
            cluster.start(name, concurrency=4, **env)
        started = time.monotonic()
        keys = [f"j{i}" for i in range(JOBS)]
        results = [noted.delay(key, 0) for key in keys]
        sent = time.monotonic()
        chorded = chord(value.si(i) for i in range(CHORD_CHILDREN))(body.s(chord_key))
        wait_until(
            lambda: run_log.exists() and len(run_log.read_text().splitlines()) >= JOBS,
            240,
            "every job to run",
        )
        drained = time.monotonic()
        assert chorded.get(timeout=120) == sum(range(CHORD_CHILDREN))
        wait_until(lambda: len(ticks(store)) >= 5, 120, "five ticks of the schedule")
    except Exception:
        print(cluster.logs())
        print(bouncer.server_log())
        raise
    finally:
        cluster.stop_all()

    runs = Counter(line.split()[0] for line in run_log.read_text().splitlines())
    again = {key: n for key, n in runs.items() if n > 1}
    print(
        f"\n[pgbouncer transaction pool 5] {JOBS} .delay() in {sent - started:.1f}s "
        f"({JOBS / (sent - started):.0f}/s); drained in {drained - started:.1f}s "
        f"({JOBS / (drained - started):.0f} jobs/s)"
    )
    assert again == {}, f"jobs that ran more than once: {sorted(again.items())[:20]}"
    assert set(runs) == set(keys)
    assert [r.get(timeout=60) for r in results] == keys
    chord_runs = [key for key, _ in side_effects(store) if key == chord_key]
    assert chord_runs == [chord_key], f"the chord body ran {len(chord_runs)} times"
    tick_keys = Counter(key for key, _ in side_effects(store) if key.startswith("tick@"))
    assert [key for key, n in tick_keys.items() if n > 1] == [], "a tick ran more than once"
    assert_every_tick_once(store)
    logs = cluster.whole_logs()
    for refused in ("DuplicatePreparedStatement", "prepared statement", "Traceback"):
        assert refused not in logs, f"{refused!r} in the worker logs:\n{logs[-6000:]}"


def test_prepared_statements_through_pgbouncer_raise_a_clear_error(
    bouncer: PrivatePgBouncer, direct_url: str
) -> None:
    JobStore(direct_url).ensure_schema()
    # Two processes' worth of connections, each preparing every statement at once: the
    # second finds the first's statement name taken on the shared server connection.
    url = f"{bouncer.url}?prepare_threshold=0"
    first, second = (JobStore(url, engine=build_engine(url)) for _ in range(2))
    try:
        with pytest.raises(PreparedStatementConflict, match="ratchet_pgbouncer"):
            for _ in range(20):
                first.count_by_status()
                second.count_by_status()
                second.list_jobs(limit=1)
    finally:
        first.engine.dispose()
        second.engine.dispose()


def test_ratchet_pgbouncer_turns_server_side_prepares_off(
    bouncer: PrivatePgBouncer, direct_url: str
) -> None:
    JobStore(direct_url).ensure_schema()
    _three_stores_prepare_nothing(bouncer, EngineOptions(pgbouncer=True))


def _three_stores_prepare_nothing(bouncer: PrivatePgBouncer, options: EngineOptions) -> None:
    """Three stores sharing the bouncer's five server connections, each statement run 30
    times: no conflict, and nothing prepared on the server."""
    stores = [JobStore(bouncer.url, engine=build_engine(bouncer.url, options)) for _ in range(3)]
    try:
        for i in range(30):
            for store in stores:
                store.enqueue(new_job(f"p{i}-{uuid.uuid4().hex}"))
                store.count_by_status()
                store.list_jobs(limit=1)
        assert sum(stores[0].count_by_status().values()) >= 90
        with stores[0].engine.connect() as conn:
            prepared = conn.execute(text("SELECT count(*) FROM pg_prepared_statements"))
            assert prepared.scalar_one() == 0
    finally:
        for store in stores:
            store.engine.dispose()


def test_pgbouncer_not_named_in_the_configuration_is_detected_and_nothing_is_prepared(
    bouncer: PrivatePgBouncer, direct_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    JobStore(direct_url).ensure_schema()
    caplog.set_level("INFO", logger="celery_ratchet.store.engine")
    # Neither ratchet_pgbouncer nor prepare_threshold: psycopg would prepare each statement
    # from its fifth run, and three stores sharing five server connections would collide.
    _three_stores_prepare_nothing(bouncer, EngineOptions())
    assert "through a connection pooler" in caplog.text
    assert str(bouncer.port) in caplog.text and "postgres@" in caplog.text


def test_listen_through_pgbouncer_is_detected_and_inserts_stop_notifying(
    bouncer: PrivatePgBouncer, direct_url: str
) -> None:
    JobStore(direct_url).ensure_schema()
    store = JobStore(
        bouncer.url, notify=True, engine_options=EngineOptions(pgbouncer=True, pool_size=2)
    )
    assert store.notify
    listener = PostgresWakeups(
        libpq_conninfo(bouncer.url), probe=store.send_probe, on_silent=store.stop_notifying,
        probe_timeout=3,
    )  # fmt: skip
    listener.start(lambda queue: None)
    try:
        wait_until(lambda: listener.heard_probe is False, 60, "the probe to be missed")
        assert listener.thread is not None
        listener.thread.join(30)
        assert not listener.thread.is_alive(), "the listener should stop"
        assert not store.notify
        assert "pg_notify" not in str(store.rows.insert)
        store.enqueue(new_job())  # an insert without pg_notify still works
    finally:
        listener.stop()


def test_listen_on_the_direct_url_hears_enqueues_made_through_pgbouncer(
    bouncer: PrivatePgBouncer, direct_url: str
) -> None:
    JobStore(direct_url).ensure_schema()
    store = JobStore(
        bouncer.url, notify=True, engine_options=EngineOptions(pgbouncer=True, pool_size=2)
    )
    try:
        with listening(store, direct_url) as (woken, heard):
            store.enqueue(new_job(queue="bounced"))
            assert heard.wait(30), "no wake-up for an enqueue made through PgBouncer"
            assert woken == ["bounced"]
            assert store.notify
    finally:
        engine_for(bouncer.url, EngineOptions(pgbouncer=True, pool_size=2)).dispose()
