"""Archiving finished jobs in batches, and job log lines, against every database."""

from __future__ import annotations

from sqlalchemy import text

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job


def _finish(store: JobStore, ids: list[str], days_ago: float) -> None:
    store.enqueue_many([new_job(i) for i in ids])
    claimed = store.claim("n", ["celery"], len(ids))
    store.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in claimed])
    if days_ago:
        with store.engine.connect() as conn:
            for job_id in ids:  # backdate as the database stores it, whatever the dialect
                row = store.result(job_id)
                assert row is not None and row.finished_at is not None
                conn.execute(
                    text("UPDATE scheduler_job SET finished_at = :t WHERE job_id = :j"),
                    {"t": _stored(store, row.finished_at, days_ago), "j": job_id},
                )


def _stored(store: JobStore, moment: object, days_ago: float) -> object:
    from datetime import timedelta

    value = moment - timedelta(days=days_ago)  # type: ignore[operator]
    return value if store.family == "postgresql" else value.replace(tzinfo=None)


def archived_ids(store: JobStore) -> set[str]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT job_id FROM scheduler_job_archive"))
        return {r[0] for r in rows}


def test_old_finished_jobs_move_in_batches_and_nothing_else_moves(store: JobStore) -> None:
    old = [f"old-{i}" for i in range(5)]
    _finish(store, old, days_ago=100)
    _finish(store, ["recent"], days_ago=0)
    store.enqueue(new_job("pending"))
    seen: list[int] = []
    assert store.archive_finished(90, batch_size=2, progress=seen.append) == 5
    assert seen == [2, 4, 5]
    assert archived_ids(store) == set(old)
    assert all(store.result(i) is None for i in old)
    remaining = {j.job_id for j in store.list_jobs(limit=50)}
    assert remaining == {"recent", "pending"}
    assert store.archive_finished(90) == 0


def test_job_log_lines_are_kept_in_order_and_purged_by_age(store: JobStore) -> None:
    store.add_log("j1", "INFO", "charging card")
    store.add_log("j1", "WARNING", "retrying \x00 with NUL")
    store.add_log("j2", "INFO", "other job")
    assert [(lv, m) for _, lv, m in store.job_log("j1")] == [
        ("INFO", "charging card"), ("WARNING", "retrying \\x00 with NUL"),
    ]  # fmt: skip
    assert store.purge_logs(30) == 0
    assert store.purge_logs(-1) == 3  # everything is older than "one day in the future"
    assert store.job_log("j1") == []
