"""Enqueue and drain rates through PgBouncer (transaction pooling, 5 server connections)
beside the same database reached directly.

    .venv/bin/python bench/pgbouncer.py [--jobs 3000] [--workers 3]

A private PgBouncer (tests/private_servers.py, on a free port) in front of the bench database
on the local PostgreSQL. Per route: ``--jobs`` ``.delay()`` calls in a loop (the enqueue rate),
then ``--workers`` workers ``-P ratchet -c 4`` drain them, timed from the workers' start; done
is counted in Redis, as bench/run.py does. Behind PgBouncer every process runs with
``RATCHET_PGBOUNCER=true`` and no LISTEN (polling). Nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402

DB = "ratchet_bench"
DIRECT = f"postgresql://postgres@127.0.0.1:5432/{DB}"
os.environ.setdefault("RATCHET_URL", DIRECT)

from bench.apps import ratchet_app  # noqa: E402
from bench.run import _redis, reset, start_worker, stop  # noqa: E402
from celery_ratchet.celery.state import ratchet_state  # noqa: E402
from tests.private_servers import PrivatePgBouncer  # noqa: E402


def use(url: str, pgbouncer: bool) -> dict[str, str]:
    env = {
        "RATCHET_URL": url,
        "RATCHET_PGBOUNCER": "true" if pgbouncer else "false",
        "RATCHET_LISTEN_NOTIFY": "false" if pgbouncer else "true",
    }
    os.environ.update(env)
    ratchet_state(ratchet_app).reset()
    ratchet_state(ratchet_app).store.ensure_schema()
    return env


def run(label: str, env: dict[str, str], jobs: int, workers: int) -> None:
    reset()
    noop = ratchet_app.tasks["bench.noop"]
    started = time.perf_counter()
    for i in range(jobs):
        noop.delay(i)
    enqueue_rate = jobs / (time.perf_counter() - started)
    started = time.perf_counter()
    procs = [start_worker("ratchet_app", "ratchet", env=env, alone=i == 0) for i in range(workers)]
    try:
        while int(_redis.get("ratchet:done") or 0) < jobs:
            if time.perf_counter() - started > 600:
                raise RuntimeError(f"{label}: not drained after 600 s")
            time.sleep(0.05)
        drain_rate = jobs / (time.perf_counter() - started)
    finally:
        for proc in procs:
            stop(proc)
    print(
        f"  {label:36} enqueue {enqueue_rate:7,.0f} /s   drain ({workers} workers -c 4) "
        f"{drain_rate:7,.0f} jobs/s",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--workers", type=int, default=3)
    args = parser.parse_args()
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
        if not c.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DB,)).fetchone():
            c.execute(f'CREATE DATABASE "{DB}"')
    bouncer = PrivatePgBouncer(5432, DB, pool_mode="transaction", pool_size=5)
    bouncer.start()
    try:
        print(f"{args.jobs} no-op jobs; PgBouncer {bouncer.url} (transaction, pool 5)")
        run("direct", use(DIRECT, pgbouncer=False), args.jobs, args.workers)
        run("through PgBouncer", use(bouncer.url, pgbouncer=True), args.jobs, args.workers)
    finally:
        ratchet_state(ratchet_app).store.engine.dispose()
        bouncer.destroy()


if __name__ == "__main__":
    main()
