"""``celery worker -P ratchet``: Celery's prefork pool, in a worker that runs from the store.

Execution stays Celery's (child processes, soft and hard time limits); what makes the worker a
ratchet worker is the ``JobConsumer`` step every ratchet app registers. ``-P threads`` and
``-P solo`` work on a ratchet app too.

Stopping is this module's own, with the guard every pool's jobs go through
(:mod:`~celery_ratchet.celery.execution.stopping`): the jobs waiting inside the pool for a free
process are handed back instead of run, the jobs running finish (a warm stop) or are cut off (a
cold one), and the pool never waits on a process that is gone. A stop signal sent to the whole
process group (``systemctl stop``, supervisord's ``stopasgroup``) is a warm stop for the pool's
processes too: they finish the job in hand rather than die with it.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import Any

from billiard import pool as billiard_pool
from celery.concurrency.prefork import TaskPool

from celery_ratchet.celery.compat import (
    billiard_pool_of,
    close_pool_at_once,
    discard_input,
    exit_as_billiard_does,
    forget_billiard_pool,
    in_stop_signal_handler,
    input_waiting,
    pool_input_queue,
    pool_processes,
    pool_state,
    pool_task_handler_alive,
    pool_unfinished_jobs,
    process_started,
    stop_pool_threads,
    take_input_lock,
)
from celery_ratchet.celery.execution.stopping import (
    COLD,
    RUNNING,
    WARM,
    request_stop,
    reset_stop,
    stop_mode,
)
from celery_ratchet.celery.state import ratchet_state

logger = logging.getLogger(__name__)

#: How long a pool process that gets SIGTERM waits to learn whether the worker is stopping
#: (the same signal reached the main process) before it takes the signal as meant for itself.
_SIGTERM_SETTLE_SECONDS = 0.3
#: A process that dies while it waits for work takes the pool's input lock with it; the
#: last clean-up waits this long for the lock, then leaves the queue as it is.
_INPUT_LOCK_SECONDS = 1.0

#: How long a pool process told to exit is given to do so before it is terminated.
_CHILD_EXIT_SECONDS = 2.0


def _on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM in a pool process. Meant for this process alone (a revoke with terminate, a
    hard time limit, a cold stop): it dies as before. Sent to the whole group while the
    worker stops warm: it finishes its job, then exits when the pool tells it to; dying
    now would lose the job, or, idle, take the pool's input lock with it."""
    deadline = time.monotonic() + _SIGTERM_SETTLE_SECONDS
    while stop_mode() == RUNNING and time.monotonic() < deadline:
        time.sleep(0.01)
    if stop_mode() == WARM:
        return
    exit_as_billiard_does(signum, frame)


class _Worker(billiard_pool.Worker):
    def after_fork(self) -> None:
        super().after_fork()
        signal.signal(signal.SIGTERM, _on_sigterm)


class _BlockingPool(billiard_pool.Pool):
    Worker = _Worker

    @staticmethod
    def _help_stuff_finish(inqueue: Any, task_handler: Any, _pool: Any) -> None:
        """billiard's (``compat.POOL_HELP_STUFF_FINISH_METHOD``), without waiting for ever.

        The input lock is held by whichever process waits for the next job; a process
        killed while it waited never releases it. Without it there is nothing to drain."""
        if not take_input_lock(inqueue, _INPUT_LOCK_SECONDS):
            return
        while task_handler.is_alive() and input_waiting(inqueue):
            discard_input(inqueue)

    def close(self) -> None:
        # The supervisor thread is stopped with the others at the end.
        close_pool_at_once(self)

    def finish(self) -> None:
        """After :meth:`close`: the running jobs finish, those still queued are skipped
        (the worker is stopping) and the processes exit on the end-of-work marker; a
        process gone, or the input lock gone with it, is not waited for. The processes
        and the pool's threads are ended whatever interrupts the wait (an error raised by
        a cold stop's handler)."""
        try:
            _wait_for_running(self)
            if stop_mode() != COLD:
                logger.debug("ratchet: pool: no job running; waiting for the processes to exit")
                # A process that got the marker exits about a second later (billiard's pause).
                _wait_for_exit(pool_processes(self), _CHILD_EXIT_SECONDS)
        finally:
            self._end_processes()

    def _end_processes(self) -> None:
        request_stop(cold=True)  # a process still there is idle, or stuck: it may die
        for process in pool_processes(self):
            if process.exitcode is None:
                process.terminate()
        _wait_for_exit(pool_processes(self), _INPUT_LOCK_SECONDS)
        # Nothing is left for the pool's threads (daemons) to do; billiard's own clean-up
        # would join each of them, each asleep for up to a second.
        logger.debug("ratchet: pool: processes ended")
        stop_pool_threads(self)


class RatchetPool(TaskPool):
    BlockingPool = _BlockingPool

    def on_start(self) -> None:
        reset_stop()
        super().on_start()

    def on_close(self) -> None:
        # The first of the worker's steps to hear of the stop: feed the pool no more.
        request_stop()
        _quiesce(self.app, wait=False)
        super().on_close()
        _quiesce(self.app)

    def on_stop(self) -> None:
        """Warm: jobs waiting in the pool are handed back, running ones finish; then the
        pool ends without waiting on processes that are gone or jobs that cannot end."""
        if asked_from_signal_handler(self.app):
            return
        pool = billiard_pool_of(self)
        if pool is None or pool_state(pool) not in (billiard_pool.RUN, billiard_pool.CLOSE):
            return
        request_stop()
        _quiesce(self.app, wait=False)
        pool.close()
        _quiesce(self.app)
        if isinstance(pool, _BlockingPool):
            pool.finish()
        else:
            pool.terminate()
        forget_billiard_pool(self)

    def on_terminate(self) -> None:
        """Cold: the running jobs are cut off, and the pool ends at once (billiard's own
        terminate would wait out its result handler's timeout, about 5 s, first)."""
        request_stop(cold=True)
        _quiesce(self.app, wait=False)
        pool = billiard_pool_of(self)
        if isinstance(pool, _BlockingPool) and pool_state(pool) in (
            billiard_pool.RUN,
            billiard_pool.CLOSE,
        ):
            pool.close()
            _quiesce(self.app)
            pool.finish()
            forget_billiard_pool(self)
        else:
            super().on_terminate()
        _quiesce(self.app)


def asked_from_signal_handler(app: Any) -> bool:
    """Celery's cold stop handler (SIGQUIT) stops the pool from inside the handler, which
    may have interrupted the worker's warm stop, or any code holding a lock a stop takes.
    There the stop is only asked for, and ``True`` returned: the main thread's own stop
    (or the terminate the cold stop sets off) does the rest once the handler returns."""
    if not in_stop_signal_handler():
        return False
    request_stop()
    _quiesce(app, wait=False)
    return True


def _quiesce(app: Any, wait: bool = True) -> None:
    """Start no more jobs; with ``wait``, also wait for the claim loop to end and hand its
    buffer back (after the pool closed: the loop may be waiting for room in it)."""
    runtime = ratchet_state(app).runtime if app is not None else None
    if runtime is not None:
        if wait:
            runtime.stop_claiming()
        else:
            runtime.request_stop()


def _wait_for_exit(processes: list[Any], seconds: float) -> None:
    """Until every started process of ``processes`` has exited, or ``seconds``. By their
    exit codes, not ``join()``: the pool's result handler joins exited processes itself,
    and two joins of one process close its sentinel twice (billiard's ``Popen.close`` is
    not thread-safe: the second close fails, or closes a descriptor reused meanwhile)."""
    deadline = time.monotonic() + seconds
    waiting = [p for p in processes if process_started(p)]
    while True:
        waiting = [p for p in waiting if p.exitcode is None]
        if not waiting or time.monotonic() >= deadline:
            return
        time.sleep(0.01)


def _wait_for_running(pool: Any) -> None:
    """Until no live process runs a job. Jobs still queued are skipped by the processes in
    a few milliseconds each; jobs that nothing will take any more (queued after the pool
    closed, or behind an input lock a dead process took with it) are left to the
    hand-back. A cold stop ends the wait: the running jobs are cut off next."""
    quiet_since = time.monotonic()
    pending = -1
    while stop_mode() != COLD:
        alive = {p.pid for p in pool_processes(pool) if p.exitcode is None}
        jobs = pool_unfinished_jobs(pool)
        if not any(pid in alive for job in jobs for pid in job.worker_pids()):
            queued = [job for job in jobs if not job.worker_pids()]
            if not queued or not alive:
                return
            handed_over = pool_task_handler_alive(pool) or input_waiting(pool_input_queue(pool))
            if not handed_over:
                return
            if len(queued) != pending:
                pending, quiet_since = len(queued), time.monotonic()
            elif time.monotonic() - quiet_since > _INPUT_LOCK_SECONDS:
                return
        time.sleep(0.02)
