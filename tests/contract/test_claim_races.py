"""No job is claimed twice, however many claimers race: 4 threads, then 4 processes."""

from __future__ import annotations

import multiprocessing
import threading
from collections import Counter
from typing import Any

import pytest

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job

JOBS = 600


def drain(url: str, node: str, batch: int) -> list[str]:
    """Claim until the queue stays empty, settling each batch as it comes."""
    store = JobStore(url)
    claimed: list[str] = []
    empty_rounds = 0
    while empty_rounds < 3:
        jobs = store.claim(node, ["celery"], batch)
        if not jobs:
            empty_rounds += 1
            continue
        empty_rounds = 0
        claimed += [j.job_id for j in jobs]
        store.settle([Settlement(j.job_id, j.token, JobStatus.SUCCEEDED) for j in jobs])
    return claimed


def drain_together(start: Any, out: Any, url: str, node: str, batch: int) -> None:
    """``drain`` once every racing process has started: a process that started first would
    otherwise empty the queue alone (seen on SQLite)."""
    start.wait(120)
    out.put(drain(url, node, batch))


def _fill(store: JobStore) -> set[str]:
    jobs = [new_job(f"race-{i}", priority=i % 10) for i in range(JOBS)]
    store.enqueue_many(jobs)
    return {j.job_id for j in jobs}


def _assert_each_claimed_once(expected: set[str], claims: list[list[str]], store: JobStore):
    counts = Counter(job_id for claimer in claims for job_id in claimer)
    assert set(counts) == expected
    assert [job_id for job_id, n in counts.items() if n > 1] == []
    assert sum(1 for c in claims if c) >= 2, "the claimers should actually have raced"
    assert store.count_by_status() == {"SUCCEEDED": JOBS}


def test_four_threads_never_claim_the_same_job(store: JobStore, db_url: str) -> None:
    expected = _fill(store)
    results: list[list[str]] = [[] for _ in range(4)]

    def run(k: int) -> None:
        results[k] = drain(db_url, f"thread-{k}", batch=7)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_each_claimed_once(expected, results, store)


@pytest.mark.slow  # separate processes, each starting Python afresh
def test_four_processes_never_claim_the_same_job(store: JobStore, db_url: str) -> None:
    expected = _fill(store)
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(4), ctx.Queue()
    processes = [
        ctx.Process(target=drain_together, args=(start, out, db_url, f"proc-{k}", 5 + k))
        for k in range(4)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=300) for _ in processes]
    for process in processes:
        process.join(60)
    _assert_each_claimed_once(expected, results, store)
