"""How long a Prometheus scrape of ``GET /metrics`` takes with a million jobs in
scheduler_job, on PostgreSQL and on MariaDB.

    .venv/bin/python bench/metrics_scrape.py [--rows 1000000] [--repeat 20]
        [--dialects postgresql,mysql] [--shapes history,backlog] [--explain]

Each (database, shape) gets the database ``ratchet_metrics_bench`` (dropped at the end),
filled by one INSERT ... SELECT (generate_series on PostgreSQL, the sequence engine on
MariaDB), then analyzed. Shapes:

- ``history``: what a busy store keeps: 96 % succeeded and 1 % failed over the last two hours
  (the last of them ending now, so that the five-minute window holds ~42,000 finished jobs at
  1 M rows), 2 % pending (half due, half later), 0.5 % waiting chain steps, 0.1 % running on
  four nodes (some holding permits of two resources), and 100 schedules, 10 of them late.
- ``backlog``: every row pending and due, over five queues and ten priorities (a fleet that
  stopped).

Then ``ratchet --url ... web --read-only`` runs as its own process and each scrape is timed as
a whole request (connect to last byte, urllib), ``--repeat`` times after a first (cold) one;
the store-read part of it is the ``ratchet_metrics_read_seconds`` the scrape reports.
``--explain`` prints each scrape statement's plan (EXPLAIN ANALYZE on PostgreSQL, ANALYZE
FORMAT=JSON's summary on MariaDB). Nothing here asserts anything; read the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sqlalchemy import create_engine, event, text  # noqa: E402

from bench.web_pages import read_only_web  # noqa: E402
from celery_ratchet.store.jobstore import JobStore  # noqa: E402
from celery_ratchet.store.metrics_reads import MetricsReads  # noqa: E402
from celery_ratchet.web.metrics import BUCKETS, SAMPLE_LIMIT, WINDOW_SECONDS  # noqa: E402

PG_SERVER = os.environ.get("BENCH_PG_SERVER", "postgres@127.0.0.1:5432")
MYSQL_SERVER = os.environ.get("BENCH_MYSQL_SERVER", "root@127.0.0.1:3306")
DB = "ratchet_metrics_bench"

# One row a number g: its status, queue, task, times. {seq}, {due}, {plus} and {cat} are the
# dialect's: the numbers 1..rows, a due time g's share of two hours ago, a time plus
# microseconds, string concatenation.
_STATUS = {
    "history": """CASE WHEN g % 100 = 0 THEN 'FAILED' WHEN g % 50 = 1 THEN 'PENDING'
                  WHEN g % 1000 = 2 THEN 'RUNNING' WHEN g % 200 = 3 THEN 'WAITING'
                  ELSE 'SUCCEEDED' END""",
    "backlog": "'PENDING'",
}
_FILL = """
INSERT INTO scheduler_job (job_id, task_name, queue, status, job_type, priority,
    scheduled_time, created_at, attempts, claims, picked_by, claim_token, claimed_at,
    finished_at, resource, payload, content_type, content_encoding, headers, properties)
SELECT {cat}('bench-', g), {cat}('bench.task_', (g DIV 3) % 20), {cat}('q', (g DIV 7) % 5),
  status, 'SINGLE', g % 10,
  CASE WHEN status = 'PENDING' AND g % 100 = 51 THEN {later} ELSE due END, due, 1, 1,
  CASE WHEN status = 'RUNNING' THEN {cat}('node-', g % 4) END,
  CASE WHEN status = 'RUNNING' THEN {cat}('token-', g) END,
  CASE WHEN status IN ('RUNNING', 'SUCCEEDED', 'FAILED') THEN {plus_wait} END,
  CASE WHEN status IN ('SUCCEEDED', 'FAILED') THEN {plus_run} END,
  CASE WHEN status = 'RUNNING' AND g % 5000 = 2 THEN {cat}('resource-', g % 2) END,
  {payload}, 'application/json', 'utf-8', '{{}}', '{{}}'
FROM (SELECT g, {status} AS status, {due} AS due FROM {seq}) AS s
"""
_DIALECT = {
    "postgresql": {
        "cat": "concat",
        "seq": "generate_series(1, :rows) AS g",
        "due": "now() - make_interval(secs => (:rows - g) * 7200.0 / :rows + 3)",
        "later": "now() + interval '1 hour'",
        "plus_wait": "due + make_interval(secs => (g % 7) * 0.01)",
        "plus_run": "due + make_interval(secs => (g % 7) * 0.01 + (g % 13) * 0.1)",
        "payload": "convert_to('[[1, 2], {}, {}]', 'UTF8')",
    },
    "mysql": {
        "cat": "concat",
        "seq": "(SELECT seq AS g FROM seq_1_to_{rows}) AS n",
        "due": "UTC_TIMESTAMP(6) - INTERVAL ((:rows - g) * 7200000000 DIV :rows + 3000000) "
        "MICROSECOND",
        "later": "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR",
        "plus_wait": "due + INTERVAL ((g % 7) * 10000) MICROSECOND",
        "plus_run": "due + INTERVAL ((g % 7) * 10000 + (g % 13) * 100000) MICROSECOND",
        "payload": "'[[1, 2], {}, {}]'",
    },
}


def _server_url(dialect: str) -> str:
    return f"postgresql://{PG_SERVER}" if dialect == "postgresql" else f"mysql://{MYSQL_SERVER}"


def _admin(dialect: str) -> Any:
    if dialect == "postgresql":
        return create_engine(
            f"postgresql+psycopg://{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT"
        )
    return create_engine(f"mysql+pymysql://{MYSQL_SERVER}/", isolation_level="AUTOCOMMIT")


def _recreate(dialect: str, *, drop_only: bool = False) -> None:
    admin = _admin(dialect)
    with admin.connect() as conn:
        if dialect == "postgresql":
            conn.execute(text(f'DROP DATABASE IF EXISTS "{DB}" WITH (FORCE)'))
            if not drop_only:
                conn.execute(text(f'CREATE DATABASE "{DB}"'))
        else:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{DB}`"))
            if not drop_only:
                conn.execute(text(f"CREATE DATABASE `{DB}` CHARACTER SET utf8mb4"))
    admin.dispose()


def fill(store: JobStore, dialect: str, shape: str, rows: int) -> float:
    parts = dict(_DIALECT[dialect])
    parts["seq"] = parts["seq"].format(rows=rows)
    sql = _FILL.format(status=_STATUS[shape], **parts)
    if dialect == "postgresql":
        sql = sql.replace("g DIV 3", "g / 3").replace("g DIV 7", "g / 7")
    started = time.perf_counter()
    with store.engine.begin() as conn:
        conn.execute(text(sql), {"rows": rows})
        if shape == "history":
            _fill_the_rest(conn, dialect)
    if dialect == "postgresql":
        with store.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(text("VACUUM ANALYZE"))
    else:
        with store.engine.connect() as conn:
            for table in ("scheduler_job", "scheduler_node", "scheduler_resource_permit"):
                conn.execute(text(f"ANALYZE TABLE {table}")).all()
    return time.perf_counter() - started


def _fill_the_rest(conn: Any, dialect: str) -> None:
    """Four nodes, two resources and their permits, 100 schedules (10 of them late)."""
    now = "now()" if dialect == "postgresql" else "UTC_TIMESTAMP(6)"
    ago = "now() - interval '30 seconds'" if dialect == "postgresql" else (
        "UTC_TIMESTAMP(6) - INTERVAL 30 SECOND"
    )  # fmt: skip
    for n in range(4):
        conn.execute(
            text(
                "INSERT INTO scheduler_node (node_id, hostname, pid, queues, concurrency, "
                f"started_at, heartbeat_ts) VALUES ('node-{n}', 'host-{n}', {n}, 'q0', 100, "
                f"{now}, {now})"
            )
        )
    for r in range(2):
        conn.execute(
            text(
                "INSERT INTO scheduler_resource (resource, capacity, updated_at) "
                f"VALUES ('resource-{r}', 10, {now})"
            )
        )
    conn.execute(
        text(
            "INSERT INTO scheduler_resource_permit (resource, job_id, node_id, acquired_at, "
            f"claim_token) SELECT resource, job_id, picked_by, {now}, claim_token "
            "FROM scheduler_job WHERE status = 'RUNNING' AND resource IS NOT NULL"
        )
    )
    for i in range(100):
        due = ago if i < 10 else (
            "now() + interval '1 hour'" if dialect == "postgresql"
            else "UTC_TIMESTAMP(6) + INTERVAL 1 HOUR"
        )  # fmt: skip
        conn.execute(
            text(
                "INSERT INTO scheduler_job (job_id, task_name, queue, status, job_type, "
                "priority, scheduled_time, created_at, business_key, schedule_spec, payload, "
                "content_type, content_encoding, headers, properties) VALUES "
                f"('recurring:s{i}', 'bench.tick', 'ratchet.schedules', 'PENDING', "
                f"'RECURRING', 4, {due}, {now}, 's{i}', 'cron:0 0 * * * ?', :payload, "
                "'application/json', 'utf-8', '{}', '{}')"
            ),
            {"payload": b"[[], {}, {}]"},
        )


def _scrape(url: str) -> tuple[float, float]:
    """(whole request seconds, the read seconds the scrape reports)."""
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as answer:
        body = answer.read().decode()
    took = time.perf_counter() - started
    found = re.search(r"^ratchet_metrics_read_seconds (\S+)$", body, re.MULTILINE)
    return took, float(found.group(1)) if found else float("nan")


def explain(store: JobStore, dialect: str) -> None:
    """Each statement of a scrape, with its plan."""
    statements: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        statements.append((statement, parameters))

    event.listen(store.engine, "before_cursor_execute", record)
    MetricsReads(store).read(window_seconds=WINDOW_SECONDS, limit=SAMPLE_LIMIT, bounds=BUCKETS)
    event.remove(store.engine, "before_cursor_execute", record)
    prefix = "EXPLAIN (ANALYZE, BUFFERS) " if dialect == "postgresql" else "ANALYZE "
    with store.engine.connect() as conn:
        for statement, parameters in statements:
            if "scheduler_job" not in statement and "scheduler_resource" not in statement:
                continue
            cursor = conn.connection.cursor()
            took = []
            for _ in range(3):
                started = time.perf_counter()
                cursor.execute(statement, parameters)
                cursor.fetchall()
                took.append((time.perf_counter() - started) * 1000)
            print(f"\n--- {min(took):.1f} ms (best of 3):", " ".join(statement.split())[:300])
            cursor.execute(prefix + statement, parameters)
            for row in cursor.fetchall():
                print("   ", " | ".join(str(c) for c in row if c is not None))


def bench(dialect: str, shape: str, rows: int, repeat: int, show_plans: bool, keep: bool) -> None:
    _recreate(dialect)
    url = f"{_server_url(dialect)}/{DB}"
    try:
        store = JobStore(url)
        store.ensure_schema()
        took = fill(store, dialect, shape, rows)
        with store.engine.connect() as conn:
            counted = conn.execute(text("SELECT count(*) FROM scheduler_job")).scalar_one()
        print(f"\n{dialect}, {shape}: {counted:,} rows in scheduler_job, filled in {took:.0f} s")
        if show_plans:
            explain(store, dialect)
        store.engine.dispose()
        with read_only_web(url) as base:
            first = _scrape(base + "/metrics")
            runs = [_scrape(base + "/metrics") for _ in range(repeat)]
        whole = [r[0] * 1000 for r in runs]
        read = [r[1] * 1000 for r in runs]
        print(
            f"  first scrape {first[0] * 1000:.1f} ms (read {first[1] * 1000:.1f} ms); then "
            f"{repeat}: median {statistics.median(whole):.1f} ms, max {max(whole):.1f} ms "
            f"(read: median {statistics.median(read):.1f} ms, max {max(read):.1f} ms)"
        )
    finally:
        if not keep:
            _recreate(dialect, drop_only=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dialects", default="postgresql,mysql")
    parser.add_argument("--shapes", default="history,backlog")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument("--keep", action="store_true", help="Leave the last database filled.")
    args = parser.parse_args()
    for dialect in args.dialects.split(","):
        for shape in args.shapes.split(","):
            bench(dialect, shape, args.rows, args.repeat, args.explain, args.keep)


if __name__ == "__main__":
    main()
