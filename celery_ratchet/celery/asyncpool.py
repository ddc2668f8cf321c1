"""``celery worker -P ratchet-async``: ``async def`` tasks as coroutines on one event loop.

One event loop per worker process, in a thread of its own, runs every ``async def`` task's
execution at once, up to ``ratchet_async_limit_single`` single jobs and
``ratchet_async_limit_batch_child`` batch children (the claim loop holds no more). Celery's
trace runs as it does on any pool (signals, results, retries, callbacks: see
:mod:`celery_ratchet.celery.aio`). Time limits: at the soft one the coroutine gets
:class:`~celery.exceptions.SoftTimeLimitExceeded` where it waits; at the hard one the
execution ends with :class:`~celery.exceptions.TimeLimitExceeded` (retried if the task
retries) and the coroutine is cancelled. A revoke with ``terminate`` cancels it too.

Tasks that are not ``async def`` run in a thread executor of ``-c`` threads, as on
``-P threads`` (no time limits there: a thread cannot be interrupted).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from billiard.einfo import ExceptionInfo
from billiard.exceptions import WorkerLostError
from celery.concurrency.base import BasePool, apply_target
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded

from celery_ratchet.celery.aio import TraceGreenlet, drive, is_async_task, require_greenlet
from celery_ratchet.celery.pool import (
    COLD,
    asked_from_signal_handler,
    guarded,
    request_stop,
    reset_stop,
    stop_mode,
)
from celery_ratchet.celery.state import ratchet_state

logger = logging.getLogger(__name__)

#: Threads for the blocking calls of async executions (result writes): the job store's
#: connections are the real limit.
_IO_THREADS = 16
#: After this long, a warm stop says which jobs it is still waiting for (it waits on, as
#: for any pool: a job cut off would run again elsewhere, a thread's even while it runs on).
_STOP_SECONDS = 60.0


class Execution:
    """One job on the pool; what Celery's request keeps (``terminate``)."""

    def __init__(self, pool: AsyncPool, target: Callable[..., Any], args: tuple[Any, ...],
                 kwargs: dict[str, Any], options: dict[str, Any]) -> None:  # fmt: skip
        self.pool = pool
        self.target = target
        self.args = args
        self.kwargs = kwargs
        self.callback: Callable[..., Any] | None = options.get("callback")
        self.accept_callback: Callable[..., Any] | None = options.get("accept_callback")
        self.error_callback: Callable[..., Any] | None = options.get("error_callback")
        self.timeout_callback: Callable[..., Any] | None = options.get("timeout_callback")
        self.soft_timeout: float | None = options.get("soft_timeout")
        self.timeout: float | None = options.get("timeout")
        self.task: asyncio.Task[Any] | None = None
        #: Why the coroutine was interrupted: "soft", "hard" or "terminate".
        self.interrupt: str | None = None
        #: The outcome went to Celery already (at the hard time limit, or a terminate).
        self.reported = False

    # -- async tasks, on the loop's thread ---------------------------------------------------

    def start(self) -> None:
        self.task = self.pool.loop.create_task(self._run())

    async def _run(self) -> None:
        loop = self.pool.loop
        timers = []
        try:
            if self.accept_callback is not None:
                self.accept_callback(os.getpid(), time.monotonic())
            if self.soft_timeout:
                timers.append(loop.call_later(self.soft_timeout, self._soft_limit))
            if self.timeout:
                timers.append(loop.call_later(self.timeout, self._hard_limit))
            trace = TraceGreenlet(self.target, loop, self.pool.io)
            result = await drive(trace, self.args, self.kwargs, translate=self._translate)
        except BaseException as exc:  # ends like a lost process
            if not self.reported:
                self.reported = True
                self._fail(exc)
            return
        finally:
            for timer in timers:
                timer.cancel()
            self.pool.done(self)
        if not self.reported and self.callback is not None:
            self.reported = True
            try:
                self.callback(result)
            except Exception:  # the other coroutines go on
                logger.exception("ratchet: outcome of job %s not reported", self.job_id)

    def _fail(self, exc: BaseException) -> None:
        if self.error_callback is None:
            return
        if not isinstance(exc, Exception):  # cut off (the loop stopped): as a lost process
            exc = WorkerLostError(f"the execution was cut off: {exc!r}")
        try:
            raise exc
        except BaseException:  # its info, for Celery's on_failure
            self.error_callback(ExceptionInfo())

    def _translate(self, exc: BaseException) -> BaseException:
        """What the coroutine is interrupted with: a cancel for a time limit becomes it."""
        if isinstance(exc, asyncio.CancelledError) and self.interrupt == "soft":
            self.interrupt = None
            uncancel = getattr(self.task, "uncancel", None)  # Python 3.11+
            if uncancel is not None:
                uncancel()
            return SoftTimeLimitExceeded(self.soft_timeout)
        return exc

    def _soft_limit(self) -> None:
        if self.task is None or self.task.done() or self.reported:
            return
        logger.debug("ratchet: soft time limit of %ss for %s", self.soft_timeout, self.job_id)
        self.interrupt = "soft"
        self.task.cancel()
        if self.timeout_callback is not None:
            self.timeout_callback(True, self.soft_timeout)

    def _hard_limit(self) -> None:
        """As a process pool does: the failure first, then the timeout; the coroutine is
        cancelled, and whatever it does after that is not reported."""
        if self.task is None or self.task.done() or self.reported:
            return
        self.reported = True
        self.interrupt = "hard"
        self.task.cancel()
        self._fail(TimeLimitExceeded(self.timeout))
        if self.timeout_callback is not None:
            self.timeout_callback(False, self.timeout)

    @property
    def trace_args(self) -> tuple[Any, ...]:
        """Celery's trace arguments: (task name, task id, ...), inside the stop guard's."""
        return self.args[1:] if self.target is guarded else self.args

    @property
    def job_id(self) -> str:
        args = self.trace_args
        return str(args[1]) if len(args) > 1 else "?"

    def terminate(self, signal: Any = None) -> None:
        """Celery's revoke with terminate: the coroutine is cancelled (Celery already
        reported the job revoked). A sync task's thread cannot be stopped: it runs on."""
        if not self.pool.is_async(self):
            logger.warning("ratchet: job %s runs in a thread and cannot be terminated", self.job_id)
            return

        def cancel() -> None:
            if self.task is not None and not self.task.done():
                self.reported = True
                self.interrupt = "terminate"
                self.task.cancel()

        self.pool.loop.call_soon_threadsafe(cancel)

    # -- sync tasks, in a thread -------------------------------------------------------------

    def run_in_thread(self) -> None:
        try:
            apply_target(self.target, self.args, self.kwargs, self.callback,
                         self.accept_callback)  # fmt: skip
        finally:
            self.pool.done(self)


class AsyncPool(BasePool):
    """The pool of ``-P ratchet-async``."""

    signal_safe = False
    body_can_be_buffer = True
    is_green = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        require_greenlet()
        super().__init__(*args, **kwargs)
        self.loop = asyncio.new_event_loop()
        self.io = ThreadPoolExecutor(max_workers=_IO_THREADS, thread_name_prefix="ratchet-io")
        self.threads = ThreadPoolExecutor(
            max_workers=max(int(self.limit or 1), 1), thread_name_prefix="ratchet-sync"
        )
        self.loop.set_default_executor(self.io)
        self._thread: threading.Thread | None = None
        self._running: set[Execution] = set()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    def on_start(self) -> None:
        reset_stop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="ratchet-async-loop", daemon=True
        )
        self._thread.start()

    def is_async(self, execution: Execution) -> bool:
        name = execution.trace_args[0] if execution.trace_args else None
        task = self.app.tasks.get(name) if isinstance(name, str) else None
        return task is not None and is_async_task(task)

    def on_apply(self, target: Callable[..., Any], args: Any = None, kwargs: Any = None,
                 **options: Any) -> Execution:  # fmt: skip
        execution = Execution(self, target, tuple(args or ()), dict(kwargs or {}), options)
        with self._lock:
            self._running.add(execution)
            self._idle.clear()
        if self.is_async(execution):
            self.loop.call_soon_threadsafe(execution.start)
        else:
            self.threads.submit(execution.run_in_thread)
        return execution

    def done(self, execution: Execution) -> None:
        with self._lock:
            self._running.discard(execution)
            if not self._running:
                self._idle.set()

    def terminate_job(self, pid: int, signal: Any = None) -> None:
        """Every job of this pool runs in this process: a terminate reaches the one job
        through :meth:`Execution.terminate`, never the process."""

    def on_close(self) -> None:
        request_stop()
        self._quiesce(wait=False)

    def on_stop(self) -> None:
        """Warm: the jobs not started are handed back (the stop is set), those running
        finish."""
        if asked_from_signal_handler(self.app):
            return
        request_stop()
        self._quiesce(wait=False)
        waited_since = time.monotonic()
        warned = False
        # A short wait in a loop: the signal of a cold stop (SIGQUIT) still reaches the
        # worker, and ends the wait.
        while not self._idle.wait(1.0) and stop_mode() != COLD and self._unreported():
            if not warned and time.monotonic() - waited_since > _STOP_SECONDS:
                warned = True
                ids = sorted(e.job_id for e in self._unreported())
                logger.warning(
                    "ratchet: the warm stop waits for %d running jobs (%s); SIGQUIT cuts "
                    "them off and hands them back",
                    len(ids),
                    ", ".join(ids[:10]),
                )
        self._quiesce()
        self._shutdown()

    def _unreported(self) -> list[Execution]:
        """Running executions whose outcome Celery has not had: a coroutine cut off by its
        hard time limit (or a terminate) that ignores the cancel is not waited for."""
        with self._lock:
            return [e for e in self._running if not e.reported]

    def on_terminate(self) -> None:
        request_stop(cold=True)
        self._quiesce(wait=False)
        self._shutdown()

    def _quiesce(self, wait: bool = True) -> None:
        """Claim and start no more; with ``wait``, hand the claim buffer back too."""
        runtime = ratchet_state(self.app).runtime if self.app is not None else None
        if runtime is not None:
            if wait:
                runtime.stop_claiming()
            else:
                runtime.request_stop()

    def _shutdown(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        self.threads.shutdown(wait=False, cancel_futures=True)
        self.io.shutdown(wait=False)

    def _get_info(self) -> dict[str, Any]:
        """``pool.info`` (``compat.BASE_POOL_GET_INFO_METHOD``), with the running count."""
        info: dict[str, Any] = super()._get_info()
        with self._lock:
            info.update({"max-concurrency": self.limit, "running": len(self._running)})
        return info
