"""Real worker processes: ``celery -A tests.acceptance.app worker -P ratchet``."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.engine import engine_for
from celery_ratchet.store.jobstore import JobStore
from tests.acceptance.app import SIDE_EFFECTS, app
from tests.conftest import Servers, empty_store
from tests.helpers import wait_until
from tests.private_postgres import PrivatePostgres, start_private_postgres

ROOT = Path(__file__).resolve().parents[2]


class Worker:
    def __init__(
        self,
        url: str,
        name: str,
        log: Path,
        *extra: str,
        pool: str = "ratchet",
        concurrency: int = 4,
        app_module: str = "tests.acceptance.app",
        **env: str,
    ) -> None:
        self.name = name
        self.log = log
        command = [sys.executable, "-m", "celery", "-A", app_module, "worker",
                   "-P", pool, "-c", str(concurrency), "-n", f"{name}@%h", "-l", "info",
                   *extra]  # fmt: skip
        environment = {**os.environ, "RATCHET_URL": url, "PYTHONPATH": str(ROOT), **env}
        # Its own process group, so that kill() reaches the pool's children too.
        with log.open("wb") as out:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(
                command,
                cwd=ROOT,
                env=environment,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout)

    def kill(self, timeout: float = 30) -> None:
        """SIGKILL the worker and every process of its group (the pool's children) at once,
        as a crashed machine would; returns when none of them runs any more."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.wait(timeout)
        wait_until(lambda: not group_members(self.pid), timeout, f"the end of {self.name}")


class Cluster:
    def __init__(self, url: str, tmp: Path) -> None:
        self.url = url
        self.tmp = tmp
        self.workers: list[Worker] = []

    def start(
        self, name: str, *extra: str, pool: str = "ratchet", concurrency: int = 4, **env: str
    ) -> Worker:
        worker = Worker(
            self.url,
            name,
            self.tmp / f"{name}.log",
            *extra,
            pool=pool,
            concurrency=concurrency,
            **env,
        )
        self.workers.append(worker)
        return worker

    def logs(self) -> str:
        """The last lines of each worker's log: to print when a test fails."""
        return "\n".join(f"--- {w.name}\n{w.log.read_text()[-4000:]}" for w in self.workers)

    def whole_logs(self) -> str:
        """Every worker's whole log: to assert on (a line early in a log counts too)."""
        return "\n".join(f"--- {w.name}\n{w.log.read_text()}" for w in self.workers)

    def stop_all(self) -> None:
        # Signal all first: the warm shutdowns run side by side, not one after another.
        for worker in self.workers:
            if worker.process.poll() is None:
                worker.process.send_signal(signal.SIGTERM)
        for worker in self.workers:
            try:
                worker.process.wait(60)
            except subprocess.TimeoutExpired:
                worker.kill()


@pytest.fixture
def ratchet_app(servers: Servers, dialect: str) -> Iterator[Celery]:
    yield from _app_on(servers.url(dialect))


@pytest.fixture
def server_app(servers: Servers, server_dialect: str) -> Iterator[Celery]:
    """The acceptance app on PostgreSQL or MariaDB: for tests of several nodes at once."""
    yield from _app_on(servers.url(server_dialect))


def _app_on(url: str) -> Iterator[Celery]:
    store = empty_store(url)
    with store.engine.connect() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {SIDE_EFFECTS}"))
        conn.execute(
            text(f"CREATE TABLE {SIDE_EFFECTS} (run_key VARCHAR(100), pid INTEGER, ppid INTEGER)")
        )
    app.conf.ratchet_url = url
    ratchet_state(app).reset()
    yield app


@pytest.fixture
def cluster(ratchet_app: Celery, tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(ratchet_app.conf.ratchet_url, tmp_path)
    yield found
    found.stop_all()


@pytest.fixture
def server_cluster(server_app: Celery, tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(server_app.conf.ratchet_url, tmp_path)
    yield found
    found.stop_all()


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    """A private PostgreSQL cluster, for tests that stop, kill or restart the server."""
    server = start_private_postgres()
    try:
        yield server
    finally:
        server.destroy()


@pytest.fixture
def private_app(private_postgres: PrivatePostgres) -> Iterator[Celery]:
    """The acceptance app on the private server; its publish retry policy restored after."""
    app = next(_app_on(private_postgres.url))
    policy = app.conf.task_publish_retry_policy
    yield app
    app.conf.task_publish_retry_policy = policy
    engine_for(private_postgres.url).dispose()
    ratchet_state(app).reset()


@pytest.fixture
def private_cluster(private_app: Celery, tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(private_app.conf.ratchet_url, tmp_path)
    yield found
    found.stop_all()


def side_effects(store: JobStore) -> list[tuple[str, int]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(f"SELECT run_key, pid FROM {SIDE_EFFECTS}"))]


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:  # gone meanwhile
            continue
        # After the command: state, ppid, pgrp.
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            found.append(int(stat.parent.name))
    return found


def fire_times(store: JobStore, prefix: str) -> list[datetime]:
    """The fire times a recurring task recorded as ``<prefix>@<eta>``, in order."""
    return sorted(
        datetime.fromisoformat(key.partition("@")[2])
        for key, _ in side_effects(store)
        if key.startswith(f"{prefix}@")
    )


def ticks(store: JobStore) -> list[datetime]:
    """The fire times the per-second schedule ``acc.tick`` recorded, in order."""
    return sorted(
        datetime.fromisoformat(key.partition("@")[2])
        for key, _ in side_effects(store)
        if key.startswith("tick@")
    )


def assert_every_tick_once(store: JobStore) -> None:
    """The per-second schedule fired once per second: no tick twice, none missing."""
    fired = ticks(store)
    gaps = [(a, b) for a, b in itertools.pairwise(fired) if b - a != timedelta(seconds=1)]
    assert gaps == [], f"ticks missing between {gaps}"


def noted_runs(run_log: Path) -> Counter[str]:
    """How many times each key ran, as acc.noted_sleep notes its runs in ``run_log``."""
    if not run_log.exists():
        return Counter()
    return Counter(line.split()[0] for line in run_log.read_text().splitlines())


def assert_each_ran_once(runs: Counter[str], keys: Iterable[str], when: str = "") -> None:
    """Every key ran, and none more than once."""
    assert set(runs) == set(keys)
    assert {k: n for k, n in runs.items() if n > 1} == {}, f"jobs ran twice{when}"
