"""How fast ``ratchet import-broker`` moves a Redis broker's queue into the store.

    .venv/bin/python bench/broker_import.py [--count 100000] [--dialects postgresql,mysql]
        [--batch-size 500]

For each database: a fresh database, a private redis-server filled with COUNT messages of
stock Celery (``send_task("acc.double", (n,))``, protocol 2, JSON), then the whole
``celery -A tests.acceptance.app ratchet import-broker redis://…`` process, timed from its
start to its exit. Reports the process's wall time, messages per second of that time, and
whether the store holds each message once and the broker none. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from sqlalchemy import create_engine, text  # noqa: E402

from bench.stream import fresh_database  # noqa: E402
from tests.private_servers import PrivateRedis  # noqa: E402


def fill(url: str, count: int) -> None:
    stock = Celery("stock", broker=url, set_as_current=False)
    with stock.producer_or_acquire() as producer:
        for n in range(count):
            stock.send_task("acc.double", args=(n,), producer=producer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--dialects", default="postgresql,mysql")
    parser.add_argument("--batch-size", default="500")
    options = parser.parse_args()
    for dialect in options.dialects.split(","):
        store_url = fresh_database(dialect).replace("+psycopg", "").replace("+pymysql", "")
        server = PrivateRedis()
        try:
            url = server.url(0)
            fill(url, options.count)
            env = {**os.environ, "RATCHET_URL": store_url, "PYTHONPATH": str(ROOT)}
            started = time.monotonic()
            done = subprocess.run(
                [sys.executable, "-m", "celery", "-A", "tests.acceptance.app", "ratchet",
                 "import-broker", url, "--batch-size", options.batch_size],
                cwd=ROOT, env=env, capture_output=True, text=True,
            )  # fmt: skip
            elapsed = time.monotonic() - started
            engine = create_engine(fresh_url(store_url))
            with engine.connect() as conn:
                stored = conn.execute(text("SELECT COUNT(DISTINCT job_id) FROM scheduler_job"))
                jobs = int(stored.scalar() or 0)
            engine.dispose()
            left = int(redis.Redis.from_url(url).llen("celery"))
            print(
                f"{dialect}: {options.count:,} messages in {elapsed:.1f} s (whole process): "
                f"{options.count / elapsed:,.0f} messages/s; store {jobs:,} jobs, broker "
                f"{left} left; exit {done.returncode}"
            )
            if done.returncode:
                print(done.stderr[-2000:])
        finally:
            server.destroy()


def fresh_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://").replace(
        "mysql://", "mysql+pymysql://"
    )


if __name__ == "__main__":
    main()
