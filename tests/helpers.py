"""Small builders shared by the test suites."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from datetime import datetime

from celery_ratchet.domain.job import Message, NewJob

BODY = json.dumps(
    [[1, 2], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]
).encode()


def new_job(
    job_id: str | None = None,
    *,
    task: str = "tests.add",
    queue: str = "celery",
    priority: int = 4,
    due: datetime | None = None,
    attempts: int = 0,
    resource: str | None = None,
) -> NewJob:
    job_id = job_id or uuid.uuid4().hex
    headers = {"id": job_id, "task": task, "retries": attempts}
    return NewJob(
        job_id=job_id,
        task_name=task,
        queue=queue,
        priority=priority,
        message=Message(BODY, "application/json", "utf-8", json.dumps(headers), "{}"),
        due=due,
        attempts=attempts,
        resource=resource,
    )


def wait_until(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Return once ``predicate()`` is true; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
