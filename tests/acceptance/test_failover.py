"""A PostgreSQL failover under running workers and a running enqueuer: a private primary with
a synchronous streaming replica, the primary killed with SIGKILL (every one of its processes,
as a crashed host) and the replica promoted. The job store URL names both hosts::

    postgresql://user@/db?host=primary:5432&host=standby:5432&target_session_attrs=read-write

Workers and the enqueuer reconnect by themselves, their LISTEN connections too, and no job
whose enqueue returned is lost. And a commit whose reply is lost while it waits on the standby
raises StoreUnavailable saying the outcome is unknown, not that nothing was enqueued.

Both servers are private clusters (initdb, pg_basebackup -R) on free ports.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, group
from sqlalchemy import create_engine, text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.store.engine import build_engine, engine_for
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.conftest import Cluster, _app_on, wait_until
from tests.helpers import new_job
from tests.private_postgres import PrivatePostgres, pg_bin, unavailable

pytestmark = [pytest.mark.slow, pytest.mark.infra]

JOBS = 300
#: Seconds between the primary's death and the standby's promotion.
OUTAGE_SECONDS = 3.0
SETTINGS = {
    "RATCHET_NODE_HEARTBEAT_INTERVAL_SECONDS": "1",
    "RATCHET_NODE_ORPHAN_GRACE_SECONDS": "30",
    "RATCHET_ORPHAN_SCAN_INTERVAL_SECONDS": "1",
}


def _admin(server: PrivatePostgres, sql: str) -> list[tuple[object, ...]]:
    engine = create_engine(
        f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/postgres",
        isolation_level="AUTOCOMMIT",
    )
    try:
        with engine.connect() as conn:
            result = conn.execute(text(sql))
            return [tuple(row) for row in result] if result.returns_rows else []
    finally:
        engine.dispose()


def _server_bin() -> Path:
    found = pg_bin()
    if found is None or not (found / "pg_basebackup").exists():
        unavailable("PostgreSQL server binaries (initdb, pg_ctl, pg_basebackup) not found")
    return found


@pytest.fixture
def pair() -> Iterator[tuple[PrivatePostgres, PrivatePostgres]]:
    """A primary and its synchronous streaming replica."""
    bin_dir = _server_bin()
    primary, standby = PrivatePostgres(bin_dir), PrivatePostgres(bin_dir)
    try:
        primary.init()
        standby.init_standby_of(primary)
        # After the base backup: the standby, once promoted, must not wait for a standby.
        _admin(primary, "ALTER SYSTEM SET synchronous_standby_names = '*'")
        _admin(primary, "SELECT pg_reload_conf()")
        wait_until(
            lambda: _admin(primary, "SELECT sync_state FROM pg_stat_replication") == [("sync",)],
            60,
            "the standby to replicate synchronously",
        )
        yield primary, standby
    finally:
        standby.destroy()
        primary.destroy()


def pair_url(primary: PrivatePostgres, standby: PrivatePostgres) -> str:
    return (
        f"postgresql://postgres@/postgres?host=127.0.0.1:{primary.port}"
        f"&host=127.0.0.1:{standby.port}&target_session_attrs=read-write"
    )


@pytest.fixture
def pair_app(pair: tuple[PrivatePostgres, PrivatePostgres]) -> Iterator[Celery]:
    url = pair_url(*pair)
    app = next(_app_on(url))
    policy = app.conf.task_publish_retry_policy
    yield app
    app.conf.task_publish_retry_policy = policy
    engine_for(url).dispose()
    ratchet_state(app).reset()


class Enqueuer(threading.Thread):
    """Sends one job after another; notes which sends returned and when."""

    def __init__(self, app: Celery) -> None:
        super().__init__(daemon=True)
        self.task = app.tasks["acc.noted_sleep"]
        #: (key, when the send began, when it returned)
        self.acked: list[tuple[str, float, float]] = []
        self.refused: list[tuple[str, bool]] = []  # (key, outcome unknown)
        self.stopping = threading.Event()

    def run(self) -> None:
        i = 0
        while not self.stopping.is_set():
            key = f"e{i}"
            i += 1
            began = time.monotonic()
            try:
                self.task.apply_async((key, 0), retry=False)
            except StoreUnavailable as exc:
                self.refused.append((key, exc.outcome_unknown))
                self.stopping.wait(0.05)
                continue
            self.acked.append((key, began, time.monotonic()))
            self.stopping.wait(0.01)


def send_urgent(app: Celery) -> bool:
    try:
        app.tasks["acc.noted_sleep"].apply_async(("urgent", 0), priority=9, retry=False)
    except StoreUnavailable:
        return False
    return True


def ran(run_log: Path) -> Counter[str]:
    if not run_log.exists():
        return Counter()
    return Counter(line.split()[0] for line in run_log.read_text().splitlines())


def test_workers_and_enqueuers_ride_out_a_failover_and_lose_no_committed_job(
    pair: tuple[PrivatePostgres, PrivatePostgres], pair_app: Celery, tmp_path: Path
) -> None:
    primary, standby = pair
    url = pair_url(primary, standby)
    store = ratchet_state(pair_app).store
    run_log = tmp_path / "runs.log"
    cluster = Cluster(url, tmp_path)
    noted = pair_app.tasks["acc.noted_sleep"]
    keys = [f"g{i}" for i in range(JOBS)]
    enqueuer = Enqueuer(pair_app)
    try:
        for name in ("f1", "f2"):
            cluster.start(name, concurrency=4, RATCHET_ACCEPTANCE_RUN_LOG=str(run_log), **SETTINGS)
        result = group(noted.s(key, 0.05) for key in keys).apply_async()
        enqueuer.start()
        wait_until(lambda: len(ran(run_log)) >= JOBS // 5, 90, "a fifth of the jobs run")
        wait_until(lambda: len(enqueuer.acked) >= 20, 60, "the enqueuer under way")
        listening = "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
        wait_until(lambda: _admin(primary, listening)[0][0] >= 2, 60, "both workers listening")

        killed = time.monotonic()
        primary.kill()
        dead = time.monotonic()
        # Not synchronisation: how long the cluster has no primary (a failover manager takes
        # a few seconds to decide), so that enqueues and claims meet the outage.
        time.sleep(OUTAGE_SECONDS)
        standby.promote()
        promoted = time.monotonic()

        wait_until(
            lambda: enqueuer.acked and enqueuer.acked[-1][1] > promoted, 60, "an enqueue after"
        )
        first_enqueue = next(t for _, _, t in enqueuer.acked if t > promoted)
        # Ahead of the backlog (priority 9): how soon a worker claims and runs again.
        wait_until(lambda: send_urgent(pair_app), 60, "an urgent job sent")
        wait_until(lambda: "urgent" in ran(run_log), 60, "the urgent job to run")
        first_run = time.monotonic()
        wait_until(lambda: _admin(standby, listening)[0][0] >= 2, 60, "both workers listening")
        enqueuer.stopping.set()
        enqueuer.join(30)
        acked = [key for key, _, _ in enqueuer.acked]
        wait_until(
            lambda: set(keys + acked) <= set(ran(run_log)), 120, "every acknowledged job to run"
        )
        wait_until(
            lambda: not {"PENDING", "RUNNING"} & set(store.count_by_status()),
            120,
            "every job to finish",
        )
        alive = [w.process.poll() for w in cluster.workers]
    except Exception:
        print(cluster.logs())
        print(primary.server_log())
        print(standby.server_log())
        raise
    finally:
        enqueuer.stopping.set()
        cluster.stop_all()

    runs = ran(run_log)
    again = {key: n for key, n in runs.items() if n > 1}
    unknown = [key for key, outcome_unknown in enqueuer.refused if outcome_unknown]
    print(
        f"\n[failover] kill -9 {dead - killed:.1f}s, no primary for {promoted - dead:.1f}s; "
        f"from the promotion to the first enqueue that returned "
        f"{first_enqueue - promoted:.1f}s, to the run of an urgent job sent after it "
        f"{first_run - promoted:.1f}s; {len(acked)} enqueues returned, "
        f"{len(enqueuer.refused)} raised ({len(unknown)} of unknown outcome, "
        f"{len(set(unknown) & set(runs))} of which ran); ran more than once: "
        f"{sorted(again.items())[:20]}; statuses {store.count_by_status()}"
    )
    missing = set(keys + acked + ["urgent"]) - set(runs)
    assert not missing, f"committed jobs lost: {sorted(missing)[:20]}"
    assert alive == [None, None], "a worker exited"
    assert result.get(timeout=60) == keys
    logs = cluster.whole_logs()
    assert "hear nothing" not in logs, "a LISTEN connection missed its probe"


def test_a_commit_whose_reply_is_lost_has_an_unknown_outcome() -> None:
    """The primary dies while a commit waits on its synchronous standby (none is attached):
    the commit is in the primary's WAL, the reply never came. The error says so."""
    server = PrivatePostgres(_server_bin())
    try:
        server.init()
        url = server.url
        JobStore(url, engine=build_engine(url)).ensure_schema()
        _admin(server, "ALTER SYSTEM SET synchronous_standby_names = 'absent'")
        _admin(server, "SELECT pg_reload_conf()")
        store = JobStore(url, engine=build_engine(url))
        job_id = uuid.uuid4().hex
        raised: list[BaseException] = []

        def enqueue() -> None:
            try:
                store.enqueue(new_job(job_id))
            except BaseException as exc:
                raised.append(exc)

        sender = threading.Thread(target=enqueue, daemon=True)
        sender.start()
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        wait_until(lambda: _admin(server, waiting)[0][0] == 1, 60, "the commit to wait")
        server.kill()
        sender.join(60)
        assert not sender.is_alive()
        assert len(raised) == 1 and isinstance(raised[0], StoreUnavailable), raised
        error = raised[0]
        assert isinstance(error, StoreUnavailable)
        assert error.outcome_unknown
        assert "outcome is unknown" in str(error)
        store.engine.dispose()

        server.restart_after_crash()
        rows = _admin(server, f"SELECT count(*) FROM scheduler_job WHERE job_id = '{job_id}'")
        assert rows == [(1,)], "the job was committed although its reply was lost"
    finally:
        server.destroy()
