"""How many jobs a worker runs and claims ahead, from its pool and its settings."""

from __future__ import annotations

from typing import Any

from celery_ratchet.celery.execution.asyncpool import AsyncPool
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.runtime.base import Capacity


def capacity_for(consumer: Any, processes: int | None = None) -> Capacity:
    """Jobs in the pool at once, and claimed ahead, from ``-c`` (or the pool's ``processes``
    now, after ``pool_grow``) and the prefetch multiplier.

    Celery's meaning: besides the jobs running, a worker holds at most concurrency x
    multiplier claimed and not started (none with ``worker_disable_prefetch``); with
    ``task_acks_late``, concurrency x multiplier in all, the running ones included (a broker
    counts a task in the prefetch until it is acknowledged at its end: Celery's way for long
    tasks, a multiplier of 1, holds one job per process). Of those not started, up to one
    per process waits in the pool, so its processes never wait for the next job to arrive;
    the rest stay in a local buffer that is handed back on shutdown.
    """
    if isinstance(consumer.pool, AsyncPool):
        # Coroutines: as many in flight as the limits by kind allow, claimed ahead by batches.
        settings = ratchet_state(consumer.app).settings
        single, children = settings.async_limit_single, settings.async_limit_batch_child
        return Capacity(
            running=single + children,
            buffered=max(settings.claim_batch_size, 1),
            single_limit=single,
            batch_child_limit=children,
        )
    concurrency = max(
        int(
            processes or getattr(consumer.pool, "limit", 0) or consumer.controller.concurrency or 1
        ),
        1,
    )
    ahead = concurrency * _multiplier(consumer)
    if consumer.app.conf.get("task_acks_late"):
        ahead -= concurrency
    if consumer.app.conf.get("worker_disable_prefetch"):  # Celery 5.6 and later
        ahead = 0
    in_pool = min(concurrency, ahead)
    return Capacity(running=concurrency + in_pool, buffered=ahead - in_pool, slots=concurrency)


def _multiplier(consumer: Any) -> int:
    """The worker's multiplier: ``--prefetch-multiplier``, else ``worker_prefetch_multiplier``
    (Celery's consumer has resolved the two). Celery takes 0 for no limit; here it keeps
    the default, 4, since claims ahead beyond that buy nothing (docs/bench.md)."""
    found = getattr(consumer, "prefetch_multiplier", None)
    if found is None:
        found = consumer.app.conf.worker_prefetch_multiplier
    multiplier = int(found or 0)
    return multiplier if multiplier > 0 else _DEFAULT_MULTIPLIER


_DEFAULT_MULTIPLIER = 4
