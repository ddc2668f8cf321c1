"""How many jobs a worker runs and claims ahead, from its pool and its settings."""

from __future__ import annotations

from typing import Any

from celery_ratchet.celery.asyncpool import AsyncPool
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.runtime.base import Capacity


def capacity_for(consumer: Any, processes: int | None = None) -> Capacity:
    """Jobs in the pool at once, and claimed ahead, from ``-c`` (or the pool's ``processes``
    now, after ``pool_grow``) and the prefetch multiplier.

    The pool gets twice its concurrency so its processes never wait for the next job to
    arrive; the rest of the prefetch stays in a local buffer that is handed back on shutdown.
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
    multiplier = int(consumer.app.conf.worker_prefetch_multiplier or 0)
    running = concurrency * 2
    total = concurrency * multiplier if multiplier > 0 else running * 2
    return Capacity(running=running, buffered=max(total - running, concurrency), slots=concurrency)
