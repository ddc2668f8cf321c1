"""``celery worker -P ratchet-async``: ``async def`` tasks as coroutines on one event loop.

One event loop per worker process, in a thread of its own, runs every ``async def`` task's
execution at once, up to ``ratchet_async_limit_single`` single jobs and
``ratchet_async_limit_batch_child`` batch children (the claim loop holds no more). Celery's
trace runs as it does on any pool (signals, results, retries, callbacks: see
:mod:`celery_ratchet.celery.execution.aio`). Time limits: at the soft one the coroutine gets
:class:`~celery.exceptions.SoftTimeLimitExceeded` where it waits; at the hard one the
execution ends with :class:`~celery.exceptions.TimeLimitExceeded` (retried if the task
retries) and the coroutine is cancelled. A revoke with ``terminate`` cancels it too.

Tasks that are not ``async def`` run in a thread executor of ``-c`` threads, as on
``-P threads``.

The hard limit is kept on time for code no cancel can reach too: a blocking call inside a
coroutine (which holds the whole event loop) or a plain task in its thread. A watchdog
thread fails the job with TimeLimitExceeded at the limit; the code runs on to its end, since
nothing can stop it, and what it returns then is dropped (logged). No soft limit in a
thread: it cannot be interrupted to raise SoftTimeLimitExceeded.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
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

from celery_ratchet.celery.execution.aio import (
    TraceGreenlet,
    drive,
    is_async_task,
    require_greenlet,
)
from celery_ratchet.celery.execution.prefork import asked_from_signal_handler
from celery_ratchet.celery.execution.stopping import (
    COLD,
    guarded,
    request_stop,
    reset_stop,
    stop_mode,
)
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.threads import background_thread

logger = logging.getLogger(__name__)

#: Threads for the blocking calls of async executions (result writes): the job store's
#: connections are the real limit.
_IO_THREADS = 16
#: What the worker says when code failed by its hard time limit ends at last.
LATE_END = "after its hard time limit"
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
        self._report_lock = threading.Lock()
        #: When the hard time limit failed the job (monotonic).
        self._limit_at: float | None = None
        #: The coroutine's code was running, not waiting, when its hard limit came.
        self._blocking_at_limit = False
        self._trace: TraceGreenlet | None = None

    def _report_once(self) -> bool:
        """Whether this caller reports the outcome: the first one does, from whichever
        thread (the loop's, the job's, the time-limit watchdog)."""
        with self._report_lock:
            first, self.reported = not self.reported, True
            return first

    def _late_end(self, cancelled: bool = False) -> None:
        """The code ended after its hard time limit failed the job: said, since its end
        changes nothing (a coroutine cancelled at once by the limit goes unsaid)."""
        late = time.monotonic() - (self._limit_at or 0.0)
        if not cancelled:
            why = "what it returned is dropped"
        elif self._blocking_at_limit:
            why = (
                "a blocking call held the event loop (and every coroutine of this worker) "
                "until then; it was cancelled at its next wait"
            )
        else:
            return
        logger.warning(
            "ratchet: job %s ended %.1fs %s, which failed it already: %s",
            self.job_id,
            late,
            LATE_END,
            why,
        )

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
            self._watch_time_limit()
            self._trace = trace = TraceGreenlet(self.target, loop, self.pool.io)
            result = await drive(trace, self.args, self.kwargs, translate=self._translate)
        except BaseException as exc:  # ends like a lost process
            if self._report_once():
                self._fail(exc)
            elif self.interrupt == "hard":
                self._late_end(cancelled=isinstance(exc, asyncio.CancelledError))
            return
        finally:
            for timer in timers:
                timer.cancel()
            self.pool.done(self)
        self._report(result)

    def _report(self, result: Any) -> None:
        if not self._report_once():
            if self.interrupt == "hard":
                self._late_end()
            return
        if self.callback is not None:
            try:
                self.callback(result)
            except Exception:  # the other jobs go on
                logger.exception("ratchet: outcome of job %s not reported", self.job_id)

    def _watch_time_limit(self) -> None:
        if self.timeout:
            self.pool.time_limits.watch(self, time.monotonic() + self.timeout)

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

    def hard_limit(self) -> None:
        """At the hard time limit, on the watchdog's thread, as a process pool does: the
        failure first, then the timeout. A coroutine is cancelled (at its next wait, if a
        blocking call holds the loop); a thread runs on. Whatever either does after that is
        not reported."""
        if not self._report_once():
            return
        self.interrupt = "hard"
        self._limit_at = time.monotonic()
        self._blocking_at_limit = self._trace is not None and self._trace.stepping
        if self.task is not None:
            self.pool.loop.call_soon_threadsafe(self.task.cancel)
        else:
            logger.warning(
                "ratchet: job %s runs in a thread past its hard time limit (%ss): it fails "
                "with TimeLimitExceeded, but a thread cannot be stopped and runs on",
                self.job_id,
                self.timeout,
            )
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
                self._report_once()
                self.interrupt = "terminate"
                self.task.cancel()

        self.pool.loop.call_soon_threadsafe(cancel)

    # -- sync tasks, in a thread -------------------------------------------------------------

    def run_in_thread(self) -> None:
        try:
            self._watch_time_limit()
            apply_target(self.target, self.args, self.kwargs, self._report,
                         self.accept_callback)  # fmt: skip
        finally:
            self.pool.done(self)


class TimeLimits:
    """A thread that calls :meth:`Execution.hard_limit` of each execution watched at its
    deadline: on time even while a blocking call holds the event loop."""

    def __init__(self) -> None:
        self._due: list[tuple[float, int, Execution]] = []
        self._order = itertools.count()
        self._changed = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def watch(self, execution: Execution, deadline: float) -> None:
        with self._changed:
            heapq.heappush(self._due, (deadline, next(self._order), execution))
            if self._thread is None:
                self._thread = background_thread(self._run, "ratchet-async-time-limits")
                self._thread.start()
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    wait = self._due[0][0] - time.monotonic() if self._due else None
                    self._changed.wait(wait)
                if self._stopped:
                    return
                _, _, execution = heapq.heappop(self._due)
            if not execution.reported:
                try:
                    execution.hard_limit()
                except Exception:  # the other limits are kept
                    logger.exception("ratchet: time limit of job %s not applied", execution.job_id)


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
        self.time_limits = TimeLimits()
        self._thread: threading.Thread | None = None
        self._running: set[Execution] = set()
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()

    def on_start(self) -> None:
        reset_stop()
        self._thread = background_thread(self.loop.run_forever, "ratchet-async-loop")
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
        self.time_limits.stop()
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
