"""The seeds' ``RATCHET_WORKER_USE_VIRTUAL_THREADS=true`` (``ratchet_worker_use_virtual_threads``):
the worker runs the async pool, ``-P ratchet-async``, the seeds' virtual threads.

A worker started without ``-P``, or with ``-P ratchet`` or ``-P prefork`` (the pools of child
processes), runs the async pool instead. One started with another pool named (``threads``,
``solo``, ``eventlet``, ``gevent``) does not start: the setting and the pool contradict each
other, and which one was meant cannot be guessed.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import concurrency, signals
from celery.concurrency.prefork import TaskPool

from celery_ratchet.celery.execution.asyncpool import AsyncPool
from celery_ratchet.celery.state import is_ratchet_app, ratchet_state

logger = logging.getLogger(__name__)

ASYNC_POOL = "ratchet-async"


def connect() -> None:
    """Once per process: the signal keeps one receiver per dispatch_uid."""
    signals.worker_init.connect(
        _on_worker_init, weak=False, dispatch_uid="celery_ratchet.pool_choice"
    )


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # Sent after the worker read its pool from -P and worker_pool, before it resolves and
    # starts it: the last moment the pool can still be chosen.
    app = getattr(sender, "app", None)
    if app is None or not is_ratchet_app(app):
        return
    if not ratchet_state(app).settings.worker_use_virtual_threads:
        return
    chosen = choose_pool(sender.pool_cls)
    if isinstance(chosen, str):
        # Celery's signal logs and swallows an Exception; the worker must not start.
        logger.critical("ratchet: %s", chosen)
        raise SystemExit(f"celery_ratchet: {chosen}")
    if chosen is not sender.pool_cls:
        logger.info("ratchet: ratchet_worker_use_virtual_threads is on: -P %s", ASYNC_POOL)
    sender.pool_cls = chosen


def choose_pool(pool: Any) -> Any:
    """The pool a worker asked for ``pool`` runs with virtual threads on: the async pool's
    class, or the reason it refuses to start (text)."""
    resolved = concurrency.get_implementation(pool)
    if isinstance(resolved, type) and issubclass(resolved, (AsyncPool, TaskPool)):
        return resolved if issubclass(resolved, AsyncPool) else AsyncPool
    return (
        f"RATCHET_WORKER_USE_VIRTUAL_THREADS (ratchet_worker_use_virtual_threads) is on, "
        f"which runs the async pool, -P {ASYNC_POOL}, but this worker was started with "
        f"-P {_alias_of(resolved)}: start it with -P {ASYNC_POOL} (or without -P), or turn "
        "the setting off"
    )


def _alias_of(pool: Any) -> str:
    path = f"{getattr(pool, '__module__', '')}:{getattr(pool, '__qualname__', pool)}"
    names = [alias for alias, target in concurrency.ALIASES.items() if target == path]
    return names[0] if names else path
