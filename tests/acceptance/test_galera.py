"""MariaDB Galera (multi-primary): three private mariadbd nodes in one cluster, one worker on
each. Claims made on different nodes at once meet at certification (error 1213 at COMMIT) and
are retried: 2,000 jobs run once each, a chord's body runs once, a per-second schedule fires
once per tick, and no worker logs an error for a conflict.

The nodes are private (their own datadirs and ports, Debian's galera-4 provider), never the
shared MariaDB.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery, chord, group

from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.store.engine import engine_for
from tests.acceptance.conftest import (
    Cluster,
    _app_on,
    assert_every_tick_once,
    side_effects,
    ticks,
    wait_until,
)
from tests.private_servers import PrivateGalera

pytestmark = [pytest.mark.slow, pytest.mark.infra]

JOBS = 2000
CHORD_CHILDREN = 30
DATABASE = "ratchet_galera"


@pytest.fixture
def galera() -> Iterator[PrivateGalera]:
    found = PrivateGalera(3)
    try:
        found.start(wait_until)
        found.nodes[0].execute(f"CREATE DATABASE {DATABASE} CHARACTER SET utf8mb4")
        yield found
    except Exception:
        print(found.logs())
        raise
    finally:
        found.destroy()


def node_urls(galera: PrivateGalera) -> list[str]:
    return [f"{node.url}{DATABASE}" for node in galera.nodes]


@pytest.fixture
def galera_app(galera: PrivateGalera) -> Iterator[Celery]:
    app = next(_app_on(node_urls(galera)[0]))
    yield app
    for url in node_urls(galera):
        engine_for(url).dispose()
    ratchet_state(app).reset()


def test_three_galera_nodes_with_a_worker_each_run_every_job_once(
    galera: PrivateGalera, galera_app: Celery, tmp_path: Path
) -> None:
    store = ratchet_state(galera_app).store
    run_log = tmp_path / "runs.log"
    workers = []
    for i, url in enumerate(node_urls(galera)):
        cluster = Cluster(url, tmp_path)
        workers.append(cluster)
        cluster.start(
            f"n{i + 1}",
            concurrency=2,
            RATCHET_ACCEPTANCE_RECURRING="tick",
            RATCHET_ACCEPTANCE_RUN_LOG=str(run_log),
        )
    noted = galera_app.tasks["acc.noted_sleep"]
    value, body = galera_app.tasks["acc.value"], galera_app.tasks["acc.chord_body"]
    chord_key = f"chord-{uuid.uuid4().hex[:8]}"
    keys = [f"j{i}" for i in range(JOBS)]

    def logs() -> str:
        return "\n".join(c.logs() for c in workers)

    try:
        # Every node's worker registered before anything is sent: a late one would find
        # the jobs run by the others.
        wait_until(lambda: len(store.list_nodes()) == len(workers), 120, "three workers registered")
        started = time.monotonic()
        result = group(noted.s(key, 0) for key in keys).apply_async()
        chorded = chord(value.si(i) for i in range(CHORD_CHILDREN))(body.s(chord_key))
        wait_until(
            lambda: run_log.exists() and len(run_log.read_text().splitlines()) >= JOBS,
            240,
            "every job to run",
        )
        drained = time.monotonic()
        assert chorded.get(timeout=120) == sum(range(CHORD_CHILDREN))
        assert result.get(timeout=120) == keys
        wait_until(lambda: len(ticks(store)) >= 5, 120, "five ticks of the schedule")
        wait_until(
            lambda: not {"PENDING", "RUNNING"} & set(store.count_by_status()),
            120,
            "every job to finish",
        )
    except Exception:
        print(logs())
        print(galera.logs())
        raise
    finally:
        for cluster in workers:
            cluster.stop_all()

    runs = Counter(line.split()[0] for line in run_log.read_text().splitlines())
    again = {key: n for key, n in runs.items() if n > 1}
    text = "\n".join(c.whole_logs() for c in workers)
    print(
        f"\n[galera 3 nodes] {JOBS} jobs drained in {drained - started:.1f}s "
        f"({JOBS / (drained - started):.0f} jobs/s); conflicts retried in completions: "
        f"{text.count('lost a lock conflict')}; claims deferred: {text.count('claim deferred')}"
    )
    assert again == {}, f"jobs that ran more than once: {sorted(again.items())[:20]}"
    assert set(runs) == set(keys)
    chord_runs = [key for key, _ in side_effects(store) if key == chord_key]
    assert chord_runs == [chord_key], f"the chord body ran {len(chord_runs)} times"
    tick_keys = Counter(key for key, _ in side_effects(store) if key.startswith("tick@"))
    assert [key for key, n in tick_keys.items() if n > 1] == [], "a tick ran more than once"
    assert_every_tick_once(store)
    pickers = {j.picked_by.split("@")[0] for j in store.list_jobs(limit=3000) if j.picked_by}
    assert pickers == {"n1", "n2", "n3"}, f"every node's worker should run jobs: {pickers}"
    assert "Traceback" not in text and "reachable again" not in text, text[-6000:]
