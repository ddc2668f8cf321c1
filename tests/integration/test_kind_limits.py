"""The claim loop's limits by kind (the async pool's): at most so many single jobs and so
many batch children in flight at once, the rest held in the buffer until a slot of their
kind frees."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Iterator

import pytest

from celery_ratchet.domain.job import ClaimedJob, JobStatus, NewJob, Settlement
from celery_ratchet.runtime.base import Capacity
from celery_ratchet.runtime.worker import WorkerRuntime
from celery_ratchet.store.jobstore import JobStore
from tests.helpers import new_job, wait_until
from tests.integration.test_runtime import FAST

SINGLE_LIMIT, CHILD_LIMIT = 3, 5


class Holder:
    """Holds every job it is given until released; counts each kind in flight."""

    def __init__(self) -> None:
        self.runtime: WorkerRuntime | None = None
        self.held: list[ClaimedJob] = []
        self.peak: Counter[bool] = Counter()
        self.ran = 0
        self._lock = threading.Lock()

    def __call__(self, job: ClaimedJob) -> None:
        with self._lock:
            self.held.append(job)
            in_flight = Counter(j.batch_child for j in self.held)
            for kind, count in in_flight.items():
                self.peak[kind] = max(self.peak[kind], count)

    def kinds(self) -> Counter[bool]:
        with self._lock:
            return Counter(j.batch_child for j in self.held)

    def release_all(self) -> None:
        with self._lock:
            done, self.held = self.held, []
            self.ran += len(done)
        assert self.runtime is not None
        for job in done:
            self.runtime.settle(Settlement(job.job_id, job.token, JobStatus.SUCCEEDED))


@pytest.fixture
def holder(store: JobStore) -> Iterator[Holder]:
    found = Holder()
    runtime = WorkerRuntime(
        store,
        FAST,
        node_id="kinds-node",
        queues=["celery"],
        capacity=Capacity(
            running=SINGLE_LIMIT + CHILD_LIMIT,
            buffered=20,
            single_limit=SINGLE_LIMIT,
            batch_child_limit=CHILD_LIMIT,
        ),
        dispatch=found,
    )
    found.runtime = runtime
    runtime.start()
    yield found
    found.release_all()
    runtime.close(timeout=10)


def _child(job_id: str) -> NewJob:
    job = new_job(job_id)
    headers = {**json.loads(job.message.headers), "group": "g1"}
    message = dataclasses.replace(job.message, headers=json.dumps(headers))
    return dataclasses.replace(job, message=message)


def test_single_jobs_and_batch_children_are_limited_each_to_their_own(
    store: JobStore, holder: Holder
) -> None:
    store.enqueue_many([new_job(f"s{i}") for i in range(10)])
    store.enqueue_many([_child(f"c{i}") for i in range(10)])
    wait_until(
        lambda: holder.kinds() == {False: SINGLE_LIMIT, True: CHILD_LIMIT},
        10,
        "each kind at its limit",
    )
    while holder.ran < 20:
        holder.release_all()
        wait_until(lambda: holder.kinds() or holder.ran == 20, 10, "the next jobs")
    wait_until(lambda: store.count_by_status() == {"SUCCEEDED": 20}, 10, "every job settled")
    assert holder.peak == {False: SINGLE_LIMIT, True: CHILD_LIMIT}
