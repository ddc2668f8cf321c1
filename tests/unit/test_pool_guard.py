"""Which jobs the pool guard hands back at a warm stop, for pools that run jobs in this
process (threads, solo)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celery_ratchet.celery.execution import stopping as pool_module


class _ThreadsLikePool:
    """Runs each job in a thread, like ``-P threads``; ``stop_after_start``: the worker's
    warm stop begins just after the job has started, before ``apply`` returns."""

    def __init__(self, *, stop_after_start: bool, shut_down: bool = False) -> None:
        self.stop_after_start = stop_after_start
        self.shut_down = shut_down
        self.threads: list[threading.Thread] = []

    def on_apply(self, target: Any, args: Any = None, kwargs: Any = None, **_: Any) -> object:
        if self.shut_down:
            raise RuntimeError("cannot schedule new futures after shutdown")
        started = threading.Event()

        def run() -> None:
            started.set()
            target(*(args or ()), **(kwargs or {}))

        thread = threading.Thread(target=run)
        thread.start()
        self.threads.append(thread)
        started.wait(5)
        if self.stop_after_start:
            pool_module.request_stop()
        return object()


@pytest.fixture(autouse=True)
def _running() -> Iterator[None]:
    pool_module.reset_stop()
    yield
    pool_module.reset_stop()


def test_a_job_that_started_just_before_the_stop_is_not_handed_back() -> None:
    pool = _ThreadsLikePool(stop_after_start=True)
    refused: list[str] = []
    ran: list[str] = []
    pool_module.guard(pool, refused.append)

    pool.on_apply(lambda kind, task_id: ran.append(task_id), ("t.add", "job-1"))
    for thread in pool.threads:
        thread.join(5)

    assert ran == ["job-1"]
    assert refused == []  # handing it back would let a second node run it again


def test_a_job_the_shut_down_pool_refused_is_handed_back() -> None:
    pool = _ThreadsLikePool(stop_after_start=False, shut_down=True)
    refused: list[str] = []
    pool_module.guard(pool, refused.append)
    pool_module.request_stop()

    assert pool.on_apply(lambda *a: None, ("t.add", "job-2")) is None
    assert refused == ["job-2"]


def test_the_prefork_pool_is_never_waited_on_for_a_free_process() -> None:
    """Celery's prefork pool blocks apply_async until a process is free: the claim loop
    that hands it jobs would stop with them. The guard asks it not to wait."""
    from celery.concurrency.prefork import TaskPool

    seen: list[object] = []
    pool = TaskPool.__new__(TaskPool)
    pool.on_apply = lambda target, args=None, kwargs=None, **options: seen.append(  # type: ignore[method-assign]
        options.get("waitforslot")
    )
    pool_module.guard(pool, lambda task_id: None)

    pool.on_apply(lambda *a: None, ("t.add", "job-1"), waitforslot=True)

    assert seen == [False]
