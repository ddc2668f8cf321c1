"""Claim cost against the size of the backlog: claim+settle from 10,000 and from 1,000,000
pending rows on PostgreSQL, aged priority order (the default) and plain priority order.

    ./dev bench backlog [--sizes 10000,1000000] [--claims 5000]

The backlog is spread over the ten priority levels and two hours of due times, written by
one INSERT ... SELECT from a template row, then ANALYZEd and checkpointed (so that no
checkpoint of the fill's pages runs during the claims). One claimer takes batches of 100
and settles each (SUCCEEDED) before the next, ``--claims`` jobs in all (at most half the
backlog, so that the smallest is not drained meanwhile); the figure is jobs
claimed and settled per second. Flat means the two sizes give about the same rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PG_ADMIN = os.environ.get("BENCH_PG_ADMIN", "host=127.0.0.1 user=postgres dbname=postgres")
BATCH = 100

Report = Callable[..., Any]

_COPIED = (
    "task_name, queue, status, job_type, created_at, attempts, claims, root_id, payload, "
    "content_type, content_encoding, properties"
)


def fill(store: Any, backlog: int) -> float:
    """``backlog`` pending rows like the template; returns the seconds it took."""
    from sqlalchemy import text

    from celery_ratchet.store.schema import metadata
    from tests.helpers import new_job

    store.ensure_schema()
    started = time.perf_counter()
    with store.engine.connect() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    store.enqueue(new_job("template"))
    with store.engine.connect() as conn:
        conn.execute(
            text(
                "INSERT INTO scheduler_job (job_id, priority, scheduled_time, headers, "
                f"{_COPIED}) SELECT 'b' || g, g % 10, now() - make_interval(secs => g % 7200), "
                f"replace(headers, '\"template\"', '\"b' || g || '\"'), {_COPIED} "
                "FROM scheduler_job, generate_series(1, :n) AS g WHERE job_id = 'template'"
            ),
            {"n": backlog},
        )
        conn.execute(text("DELETE FROM scheduler_job WHERE job_id = 'template'"))
        conn.execute(text("VACUUM ANALYZE scheduler_job"))
        # The fill's dirty pages are written now, not by a checkpoint during the claims.
        conn.execute(text("CHECKPOINT"))
    return time.perf_counter() - started


def claim_and_settle(store: Any, claims: int) -> float:
    from celery_ratchet.domain.job import JobStatus, Settlement

    taken, start = 0, time.perf_counter()
    while taken < claims:
        jobs = store.claim("bench", ["celery"], BATCH)
        if not jobs:
            break
        store.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in jobs])
        taken += len(jobs)
    return taken / (time.perf_counter() - start)


@contextmanager
def own_database() -> Iterator[str]:
    """A database for this run only (other benches truncate theirs); dropped afterwards."""
    import psycopg

    name = f"ratchet_backlog_{os.getpid()}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://postgres@127.0.0.1/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_backlog(sizes: list[int], claims: int, report: Report) -> None:
    print(f"backlog: claim+settle of {claims:,} jobs in batches of {BATCH}, PostgreSQL")
    with own_database() as url:
        _bench(url, sizes, claims, report)


def _bench(url: str, sizes: list[int], claims: int, report: Report) -> None:
    from celery_ratchet.store.jobstore import JobStore

    for label, boost in (("aged priority (default)", 15.0), ("plain priority", 0.0)):
        rates = []
        for size in sizes:
            store = JobStore(url, priority_boost_minutes=boost)
            seconds = fill(store, size)
            rate = claim_and_settle(store, min(claims, size // 2))
            rates.append(rate)
            report("backlog", f"{label}, {size:,} pending", rate, "jobs/s",
                   f"filled in {seconds:.0f} s")  # fmt: skip
            store.engine.dispose()
        report("backlog", f"{label}: largest / smallest", rates[-1] / rates[0], "x")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="./dev bench backlog", description=__doc__)
    parser.add_argument("--sizes", default="10000,1000000", help="pending rows, comma-separated")
    parser.add_argument(
        "--claims", type=int, default=5_000, help="jobs claimed per size (at most half of it)"
    )
    args = parser.parse_args(argv)

    def show(section: str, subject: str, value: float, unit: str, note: str = "") -> None:
        print(f"  {subject:44} {value:>10,.2f} {unit:8} {note}", flush=True)

    bench_backlog([int(s) for s in args.sizes.split(",")], args.claims, show)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
