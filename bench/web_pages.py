"""How long the dashboard's pages take with a million jobs in scheduler_job (PostgreSQL).

    .venv/bin/python bench/web_pages.py [--rows 1000000] [--repeat 5]

Creates the database ``ratchet_web_bench`` (dropped at the end), fills scheduler_job with
``--rows`` jobs in one INSERT ... SELECT from generate_series (most succeeded, finished over
the last two hours; some pending, failed, running; five queues, tags), starts
``ratchet --url ... web`` as its own process and times whole requests (connect to last byte)
of each page with urllib. Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, text  # noqa: E402

from celery_ratchet.store.jobstore import JobStore  # noqa: E402

SERVER = os.environ.get("BENCH_PG_SERVER", "postgresql://postgres@127.0.0.1:5432")
DB = "ratchet_web_bench"

FILL = """
INSERT INTO scheduler_job (job_id, task_name, queue, status, job_type, priority,
    scheduled_time, created_at, attempts, claims, tags, business_key, finished_at, payload,
    content_type, content_encoding, headers, properties, last_error)
SELECT 'bench-' || g,
       'bench.task_' || (g % 20),
       'q' || (g % 5),
       CASE WHEN g % 100 = 0 THEN 'FAILED' WHEN g % 50 = 1 THEN 'PENDING'
            WHEN g % 1000 = 2 THEN 'RUNNING' ELSE 'SUCCEEDED' END,
       'SINGLE', 4,
       now() - make_interval(secs => (:rows - g) * 7200.0 / :rows),
       now() - make_interval(secs => (:rows - g) * 7200.0 / :rows),
       1, 1,
       CASE WHEN g % 10 = 0 THEN ',nightly,' END,
       CASE WHEN g % 1000 = 5 THEN 'order-' || g END,
       CASE WHEN g % 100 = 0 OR (g % 50 <> 1 AND g % 1000 <> 2)
            THEN now() - make_interval(secs => (:rows - g) * 7200.0 / :rows) END,
       convert_to('[[1, 2], {}, {}]', 'UTF8'),
       'application/json', 'utf-8', '{}', '{}',
       CASE WHEN g % 100 = 0 THEN '{"exc_type": "ValueError"}' END
FROM generate_series(1, :rows) AS g
"""

PAGES = (
    "/",
    "/jobs",
    "/jobs?q=task_7",
    "/jobs?q=none-such",
    "/jobs?range=15m",
    "/jobs?range=1h&status=FAILED",
    "/jobs?until={hour_ago}",
    "/jobs?since={two_hours_ago}&until={hour_ago}&q=task_7",
    "/jobs?ticks=1",
    "/jobs?q=bench-123456",
    "/tasks?window=15m",
    "/tasks",
    "/task?name=bench.task_7&window=15m",
    "/task?name=bench.task_7",
    "/queues",
    "/schedules",
    "/static/dashboard.js",
    "/jobs?status=FAILED",
    "/jobs?queue=q3",
    "/jobs?tag=nightly",
    "/jobs?task=bench.task_7",
    "/jobs?before=bench-500000",
    "/jobs?status=RUNNING&queue=q2",
    "/jobs?key=order-999005",
    "/jobs?tag=none-such",
    "/job?id=bench-123456",
    "/dlq",
    "/nodes",
)


def _admin() -> object:
    return create_engine(
        f"{SERVER.replace('postgresql://', 'postgresql+psycopg://')}/postgres",
        isolation_level="AUTOCOMMIT",
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _timed(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=60) as answer:
        answer.read()
    return time.perf_counter() - started


@contextmanager
def read_only_web(url: str) -> Iterator[str]:
    """``ratchet --url URL web --read-only`` as a process of its own, once it answers: its
    base URL (bench/metrics_scrape.py scrapes the same)."""
    server = subprocess.Popen(
        [sys.executable, "-m", "celery_ratchet.cli.main", "--url", url, "web",
         "--port", str(port := _free_port()), "--read-only"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                _timed(base + "/nodes")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield base
    finally:
        server.terminate()
        server.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Leave the database for a look.")
    args = parser.parse_args()
    admin = _admin()
    with admin.connect() as conn:  # type: ignore[attr-defined]
        conn.execute(text(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{DB}"'))
    url = f"{SERVER}/{DB}"
    try:
        store = JobStore(url)
        store.ensure_schema()
        started = time.perf_counter()
        with store.engine.begin() as conn:
            conn.execute(text(FILL), {"rows": args.rows})
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE scheduler_job"))
        print(f"filled {args.rows} rows in {time.perf_counter() - started:.1f} s")
        store.engine.dispose()
        with read_only_web(url) as base:
            _time_pages(base, args.repeat)
    finally:
        if not args.keep:
            with admin.connect() as conn:  # type: ignore[attr-defined]
                conn.execute(text(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)'))


def _time_pages(base: str, repeat: int) -> None:
    print(f"{'page':56} {'median ms':>10} {'max ms':>8}  (whole request, {repeat} runs)")
    now = datetime.now(timezone.utc)
    moments = {
        "hour_ago": (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M"),
        "two_hours_ago": (now - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M"),
    }
    for template in PAGES:
        page = template.format(**moments)
        times = [_timed(base + page) * 1000 for _ in range(repeat)]
        print(f"{template:56} {statistics.median(times):10.1f} {max(times):8.1f}")


if __name__ == "__main__":
    main()
