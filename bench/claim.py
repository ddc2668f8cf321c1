"""Claim throughput over a backlog: aged priority order, plain order, raw SQL, permits.

One claimer takes batches of 100 from a backlog spread over the ten priority levels and two
hours of due times, on PostgreSQL and MariaDB, beside the plainest claim the database can do
(one statement / one transaction making the same row changes, no aging, no ratchet code).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from sqlalchemy import create_engine, text

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.store.jobstore import JobStore
from celery_ratchet.store.schema import metadata
from tests.helpers import new_job

BATCH = 100
RAW = {
    "postgresql": (
        "UPDATE scheduler_job SET status = 'RUNNING', picked_by = 'raw', claim_token = 'raw', "
        "claimed_at = now(), started_at = NULL, claims = claims + 1 "
        "WHERE id = ANY(ARRAY(SELECT id FROM scheduler_job WHERE status = 'PENDING' AND "
        "queue = 'celery' AND resource IS NULL AND scheduled_time <= now() "
        "ORDER BY priority DESC, scheduled_time, id LIMIT 100 FOR UPDATE SKIP LOCKED)) "
        "RETURNING id, payload, headers"
    ),
    "mysql": (
        "SELECT id, payload, headers FROM scheduler_job WHERE status = 'PENDING' AND "
        "resource IS NULL AND queue = 'celery' AND scheduled_time <= UTC_TIMESTAMP(6) "
        "ORDER BY priority DESC, scheduled_time, id LIMIT 100 FOR UPDATE SKIP LOCKED"
    ),
}


def _fill(store: JobStore, backlog: int, resource: str | None = None) -> None:
    store.ensure_schema()
    with store.engine.connect() as conn:
        for table in reversed(metadata.sorted_tables):
            conn.execute(table.delete())
    now = datetime.now(timezone.utc)
    jobs = [
        new_job(f"b{i}", priority=i % 10, due=now - timedelta(seconds=i % 7200), resource=resource)
        for i in range(backlog)
    ]
    store.enqueue_many(jobs)
    with store.engine.connect() as conn:
        if store.family == "postgresql":
            conn.execute(text("ANALYZE scheduler_job"))
        else:
            conn.execute(text("ANALYZE TABLE scheduler_job"))


def _rate(n: int, claim: Callable[[], int]) -> float:
    taken, start = 0, time.perf_counter()
    while taken < n:
        got = claim()
        if not got:
            break
        taken += got
    return taken / (time.perf_counter() - start)


def _raw_claim(url: str, family: str) -> Callable[[], int]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://").replace(
        "mysql://", "mysql+pymysql://"), isolation_level="AUTOCOMMIT")  # fmt: skip
    conn = engine.connect()

    def claim() -> int:
        if family == "postgresql":
            return len(conn.execute(text(RAW["postgresql"])).all())
        conn.exec_driver_sql("BEGIN")
        ids = [r.id for r in conn.execute(text(RAW["mysql"])).all()]
        if ids:
            conn.execute(
                text(
                    "UPDATE scheduler_job SET status = 'RUNNING', picked_by = 'raw', "
                    "claim_token = 'raw', claimed_at = UTC_TIMESTAMP(6), started_at = NULL, "
                    "claims = claims + 1 WHERE id IN :ids"
                ).bindparams(ids=tuple(ids))
            )
        conn.exec_driver_sql("COMMIT")
        return len(ids)

    return claim


def bench_claim(urls: dict[str, str], backlog: int, n: int, report: Callable[..., Any]) -> None:
    print(f"claim: batches of {BATCH} from a backlog of {backlog:,}, {n:,} claimed per row")
    for family, url in urls.items():
        for label, boost in (("aged priority (default)", 15.0), ("plain priority", 0.0)):
            store = JobStore(url, priority_boost_minutes=boost)
            _fill(store, backlog)
            rate = _rate(n, lambda s=store: len(s.claim("bench", ["celery"], BATCH)))
            report("claim", f"{family}: ratchet, {label}", rate, "jobs/s")
        store = JobStore(url)
        _fill(store, backlog)
        report("claim", f"{family}: raw SQL claim", _rate(n, _raw_claim(url, family)), "jobs/s")

        def with_permits(s: JobStore = store) -> int:
            jobs = s.claim_for_resource("bench", ["celery"], "payments", BATCH, BATCH)
            s.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED, resource="payments")
                      for j in jobs])  # fmt: skip
            return len(jobs)

        def without(s: JobStore = store) -> int:
            jobs = s.claim("bench", ["celery"], BATCH)
            s.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in jobs])
            return len(jobs)

        _fill(store, backlog)
        report("claim", f"{family}: claim+settle, no resource", _rate(n, without), "jobs/s")
        _fill(store, backlog, resource="payments")
        report("claim", f"{family}: claim+settle, permits (cap {BATCH})", _rate(n, with_permits),
               "jobs/s")  # fmt: skip
