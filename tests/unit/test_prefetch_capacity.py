"""How much a worker holds, from its concurrency and Celery's prefetch settings: at most
concurrency x multiplier claimed and not started, beside the jobs running."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_ratchet.celery.execution.capacity import capacity_for


def _consumer(concurrency: int, multiplier: int | None, **conf: Any) -> Any:
    settings = {"worker_prefetch_multiplier": 4, **conf}
    return SimpleNamespace(
        pool=SimpleNamespace(limit=concurrency),
        controller=SimpleNamespace(concurrency=concurrency),
        prefetch_multiplier=multiplier,
        app=SimpleNamespace(conf=SimpleNamespace(get=settings.get, **settings)),
    )


@pytest.mark.parametrize(
    ("concurrency", "multiplier", "running", "buffered"),
    [
        (2, 1, 4, 0),  # one waiting in the pool per process, nothing more
        (4, 4, 8, 12),  # Celery's default: 16 not started
        (1, 3, 2, 2),
        (3, 0, 6, 9),  # Celery's "no limit": the default multiplier
    ],
)
def test_not_started_jobs_are_concurrency_times_multiplier(
    concurrency: int, multiplier: int, running: int, buffered: int
) -> None:
    capacity = capacity_for(_consumer(concurrency, multiplier))
    assert (capacity.running, capacity.buffered, capacity.executing) == (
        running,
        buffered,
        concurrency,
    )
    not_started = capacity.total - capacity.executing
    assert not_started == concurrency * (multiplier or 4)


def test_the_setting_counts_when_the_consumer_has_no_multiplier_of_its_own() -> None:
    capacity = capacity_for(_consumer(2, None, worker_prefetch_multiplier=1))
    assert capacity.total == 4


def test_disabled_prefetch_claims_only_for_free_processes() -> None:
    capacity = capacity_for(_consumer(3, 4, worker_disable_prefetch=True))
    assert (capacity.running, capacity.buffered) == (3, 0)


@pytest.mark.parametrize(
    ("concurrency", "multiplier", "running", "buffered"),
    [
        (2, 1, 2, 0),  # Celery's "reserve one task per process": the running ones only
        (4, 4, 8, 8),  # 16 held in all, the 4 running among them
        (1, 3, 2, 1),
    ],
)
def test_late_acknowledgement_counts_the_running_jobs_in_the_prefetch(
    concurrency: int, multiplier: int, running: int, buffered: int
) -> None:
    """With task_acks_late a broker's prefetch counts each task until it ends, so a worker
    holds concurrency x multiplier in all, the running ones included (Celery's advice for
    long tasks: task_acks_late and a multiplier of 1, each process holding one)."""
    capacity = capacity_for(_consumer(concurrency, multiplier, task_acks_late=True))
    assert (capacity.running, capacity.buffered, capacity.executing) == (
        running,
        buffered,
        concurrency,
    )
    assert capacity.total == concurrency * multiplier
