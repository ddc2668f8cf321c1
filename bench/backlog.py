"""Claim cost against the size of the backlog: claim+settle from 10,000 and from 1,000,000
pending rows on PostgreSQL, aged priority order (the default) and plain priority order.

    ./dev bench backlog [--sizes 10000,1000000] [--claims 2000] [--rounds 12]

Each size has a database of its own, filled once: the backlog is spread over the ten
priority levels and two hours of due times, written by one INSERT ... SELECT from a template
row, then ANALYZEd and checkpointed (so that no checkpoint of the fill's pages runs during the
claims). Then rounds: in each, one claimer takes ``--claims`` jobs in batches of 100 from each
size in turn, settling each batch (SUCCEEDED) before the next; after its round each backlog
is put back as it was (the settled rows PENDING again, vacuumed), untimed. The figure is jobs
claimed and settled per second; the ratio largest / smallest is taken round by round, both
sizes having run side by side, so that the machine's drift during the run cancels out, and
its median and spread are reported. Flat means a median near 1. ``BENCH_PG_ADMIN`` (a libpq
connection string, default the local server's ``postgres`` database) runs it on another
server.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
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


def put_back(store: Any) -> None:
    """The rows a round settled pending again, and the dead row versions that left vacuumed:
    every round claims from the same backlog."""
    from sqlalchemy import text

    with store.engine.connect() as conn:
        conn.execute(
            text(
                "UPDATE scheduler_job SET status = 'PENDING', picked_by = NULL, "
                "claim_token = NULL, claimed_at = NULL, started_at = NULL, finished_at = NULL "
                "WHERE status <> 'PENDING'"
            )
        )
        conn.execute(text("VACUUM ANALYZE scheduler_job"))


@contextmanager
def own_database(label: str) -> Iterator[str]:
    """A database for this run only (other benches truncate theirs); dropped afterwards."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    name = f"ratchet_backlog_{os.getpid()}_{label}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        server = conninfo_to_dict(PG_ADMIN)
        host, port = server.get("host", "127.0.0.1"), server.get("port", "5432")
        yield f"postgresql://{server.get('user', 'postgres')}@{host}:{port}/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_backlog(sizes: list[int], claims: int, rounds: int, report: Report) -> None:
    claims = min([claims] + [size // 2 for size in sizes])  # no backlog drained in a round
    print(
        f"backlog: claim+settle of {claims:,} jobs in batches of {BATCH} from each of "
        f"{', '.join(f'{s:,}' for s in sizes)} pending rows in turn, {rounds} rounds, PostgreSQL"
    )
    with ExitStack() as stack:
        urls = [stack.enter_context(own_database(str(size))) for size in sizes]
        _bench(urls, sizes, claims, rounds, report)


def _bench(urls: list[str], sizes: list[int], claims: int, rounds: int, report: Report) -> None:
    from celery_ratchet.store.jobstore import JobStore

    for label, boost in (("aged priority (default)", 15.0), ("plain priority", 0.0)):
        stores = [JobStore(url, priority_boost_minutes=boost) for url in urls]
        for store, size in zip(stores, sizes, strict=True):
            seconds = fill(store, size)
            print(f"  {label}: {size:,} pending rows filled in {seconds:.0f} s", flush=True)
        rates: list[list[float]] = [[] for _ in sizes]
        for round_ in range(rounds):
            # Which size goes first alternates too: neither always runs on a warmer machine.
            order = list(range(len(sizes)))
            if round_ % 2:
                order.reverse()
            for i in order:
                rates[i].append(claim_and_settle(stores[i], claims))
                put_back(stores[i])
        for size, measured in zip(sizes, rates, strict=True):
            report("backlog", f"{label}, {size:,} pending", statistics.median(measured),
                   "jobs/s", f"median of {rounds} rounds, {min(measured):,.0f}-"
                   f"{max(measured):,.0f}")  # fmt: skip
        ratios = sorted(large / small for small, large in zip(rates[0], rates[-1], strict=True))
        report("backlog", f"{label}: largest / smallest", statistics.median(ratios), "x",
               f"round by round, {ratios[0]:.2f}-{ratios[-1]:.2f}")  # fmt: skip
        for store in stores:
            store.engine.dispose()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="./dev bench backlog", description=__doc__)
    parser.add_argument("--sizes", default="10000,1000000", help="pending rows, comma-separated")
    parser.add_argument(
        "--claims",
        type=int,
        default=2_000,
        help="jobs claimed from each size in a round (at most half the smallest)",
    )
    parser.add_argument("--rounds", type=int, default=12, help="rounds of claims, sizes in turn")
    args = parser.parse_args(argv)

    def show(section: str, subject: str, value: float, unit: str, note: str = "") -> None:
        print(f"  {subject:44} {value:>10,.2f} {unit:8} {note}", flush=True)

    bench_backlog([int(s) for s in args.sizes.split(",")], args.claims, args.rounds, show)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
