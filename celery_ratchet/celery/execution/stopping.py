"""The worker's stop, as each of its processes sees it, and the guard on every pool's jobs.

A job handed to the pool may wait there for a free process or thread. Once the worker begins to
stop, such a job must not start: the guard (:func:`guard`, on any pool: ``-P ratchet``,
``ratchet-async``, ``threads``, ``solo``) runs each job through :func:`guarded`, which hands it
back (:class:`HandedBack`, back to PENDING at once) instead.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from billiard.einfo import ExceptionInfo
from billiard.sharedctypes import RawValue
from celery.concurrency.prefork import TaskPool

#: The worker's stop, as every process of it sees it: 0 running, then WARM or COLD. Shared
#: memory made before the pool forks, so its processes read what the main process writes.
RUNNING, WARM, COLD = 0, 1, 2
_STOP: Any = RawValue(ctypes.c_int, RUNNING)


class HandedBack(Exception):
    """The job was still waiting for a free execution slot when the worker began to stop:
    it did not run, and goes back to PENDING at once."""


def stop_mode() -> int:
    return int(_STOP.value)


def request_stop(cold: bool = False) -> None:
    """The worker is stopping: jobs not started yet will not start. Safe in a signal
    handler. A cold stop also lets the pool's processes die with their jobs."""
    _STOP.value = max(int(_STOP.value), COLD if cold else WARM)


def reset_stop() -> None:
    """A new worker in this process (tests start several in turn)."""
    _STOP.value = RUNNING


def guarded(trace: Callable[..., Any], *args: Any) -> Any:
    """Runs in the executing process or thread: starts the job, unless the worker began to
    stop while the job waited for its turn. Returns what Celery's trace returns: (failed,
    result or exception info, runtime)."""
    if _STOP.value != RUNNING:
        try:
            raise HandedBack("the worker is stopping; the job did not start")
        except HandedBack:
            return 1, ExceptionInfo(internal=True), 0.0
    return trace(*args)


def guard(pool: Any, refused: Callable[[str], None]) -> None:
    """Every job this worker's pool (any pool: prefork, threads, solo) starts goes in
    through :func:`guarded`. Celery's requests call the pool's ``apply_async``, which calls
    ``on_apply``: that is where the job is wrapped. A job the pool refuses because it is
    closing is passed to ``refused`` (its task id)."""
    apply = pool.on_apply
    if getattr(apply, "ratchet_guarded", False):
        return
    # Threads and solo run what they accept, and :func:`guarded` there hands back a job
    # that starts after the stop: only a job they refused is ours to hand back. Handed back
    # after it was accepted, a job that had just started would run on under a lost claim.
    in_child_processes = isinstance(pool, TaskPool)

    def on_apply(target: Callable[..., Any], args: Any = None, kwargs: Any = None,
                 **options: Any) -> Any:  # fmt: skip
        args = tuple(args or ())
        if in_child_processes:
            # Celery's prefork pool waits in apply_async for a process to be free (its
            # putlocks): that would stop the claim loop which called it, with jobs of the
            # node's prefetch neither in the pool nor claimable by it. The node bounds what
            # it hands the pool (runtime.Capacity); the rest waits in the pool's queue.
            options["waitforslot"] = False
        try:
            result = apply(guarded, (target, *args), kwargs, **options)
        except RuntimeError:  # a thread pool shut down already
            if _STOP.value == RUNNING:
                raise
            result = None
        if _STOP.value != RUNNING and len(args) > 1 and (in_child_processes or result is None):
            # Handed over to a process as the pool closed: it may never reach one, and if
            # it does it will not start (the stop is set). Its row goes back now; a second
            # report of the same claim, when a process skips it, changes nothing.
            refused(str(args[1]))  # Celery's trace arguments: (type, task id, ...)
        return result

    on_apply.ratchet_guarded = True  # type: ignore[attr-defined]
    pool.on_apply = on_apply
