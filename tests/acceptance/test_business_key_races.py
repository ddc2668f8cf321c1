"""Business keys under concurrent senders: 8 processes send the same 20 keys 50 times each,
all at once. The database's unique index lets exactly one job per key exist; every caller
gets that job's id. Once a real worker has run them, the keys take new jobs."""

from __future__ import annotations

import multiprocessing
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import text

from celery_ratchet.celery.state import ratchet_state
from tests.acceptance.conftest import Cluster
from tests.helpers import wait_until

pytestmark = pytest.mark.slow

SENDERS = 8
SENDS_EACH = 50
KEYS = [f"tenant-{i}" for i in range(20)]


def send_keys(url: str, offset: int, start: Any, results: Any) -> None:
    """One sending process: connect, wait for all the others, then send as fast as it can."""
    from tests.acceptance.app import app

    app.conf.ratchet_url = url
    state = ratchet_state(app)
    state.reset()
    state.store.ensure_schema()
    task = app.tasks["acc.value"]
    start.wait(120)
    got = []
    for i in range(SENDS_EACH):
        key = KEYS[(i + offset) % len(KEYS)]
        got.append((key, task.apply_async((i,), ratchet={"business_key": key}).id))
    results.put(got)


def send_from_processes(url: str) -> list[tuple[str, str]]:
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(SENDERS)
    results = context.Queue()
    senders = [
        context.Process(target=send_keys, args=(url, n, start, results)) for n in range(SENDERS)
    ]
    for sender in senders:
        sender.start()
    sent = [pair for _ in senders for pair in results.get(timeout=300)]
    for sender in senders:
        sender.join(60)
        assert sender.exitcode == 0
    return sent


def jobs_by_key(app: Celery) -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    with ratchet_state(app).store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT business_key, job_id, status FROM scheduler_job "
                "WHERE business_key LIKE 'tenant-%' ORDER BY id"
            )
        )
        for row in rows:
            found.setdefault(row.business_key, []).append((row.job_id, row.status))
    return found


def test_concurrent_senders_of_the_same_keys_make_one_job_per_key(
    ratchet_app: Celery, cluster: Cluster
) -> None:
    url = ratchet_app.conf.ratchet_url
    sent = send_from_processes(url)
    assert len(sent) == SENDERS * SENDS_EACH

    jobs = jobs_by_key(ratchet_app)
    assert sorted(jobs) == sorted(KEYS)
    assert all(len(held) == 1 for held in jobs.values()), jobs
    assert {status for held in jobs.values() for _, status in held} == {"PENDING"}
    holders = {key: held[0][0] for key, held in jobs.items()}
    assert all(job_id == holders[key] for key, job_id in sent)

    cluster.start("w1")

    def all_ran() -> bool:
        return all(s == "SUCCEEDED" for h in jobs_by_key(ratchet_app).values() for _, s in h)

    wait_until(all_ran, 120, "the 20 jobs run by the worker")

    task = ratchet_app.tasks["acc.value"]
    again = {key: task.apply_async((0,), ratchet={"business_key": key}).id for key in KEYS}
    assert not set(again.values()) & set(holders.values())
    jobs = jobs_by_key(ratchet_app)
    assert all([job_id for job_id, _ in jobs[key]] == [holders[key], again[key]] for key in KEYS)
    wait_until(all_ran, 120, "the keys' new jobs run by the worker")
