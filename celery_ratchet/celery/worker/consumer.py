"""The consumer bootstep that feeds Celery's worker from the job store instead of a broker.

It wires the execution path (:mod:`celery_ratchet.celery.execution`: each claimed row to the
task's own strategy, exactly as a broker's delivery would be, and its outcome back) to the
worker's runtime: the Dispatcher, the stop guard on the pool, the fenced tracers, the request
class of every task. Besides: housekeeping, recurring jobs, task-option checks, and revokes of
jobs already handed to Celery.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any

from celery import bootsteps, signals
from celery.concurrency.base import BasePool
from celery.exceptions import TaskRevokedError
from celery.platforms import EX_FAILURE
from celery.platforms import signals as platform_signals
from celery.utils.imports import symbol_by_name
from celery.worker import state as worker_state

from celery_ratchet.celery.canvas import streams
from celery_ratchet.celery.compat import request_already_revoked, request_terminates_on_ack
from celery_ratchet.celery.control.alerts import dead_letter_alerts
from celery_ratchet.celery.execution.capacity import capacity_for
from celery_ratchet.celery.execution.dispatch import Dispatcher
from celery_ratchet.celery.execution.fencing import fence_tracers
from celery_ratchet.celery.execution.request import ratchet_request_class
from celery_ratchet.celery.execution.stopping import guard, request_stop, reset_stop
from celery_ratchet.celery.results.backend import exception_record
from celery_ratchet.celery.schedules.housekeeping import register_archiver
from celery_ratchet.celery.schedules.recurring import BeatOwnership, occurrence, register_all
from celery_ratchet.celery.send.message import safe_accept
from celery_ratchet.celery.send.options import resolve as resolve_options
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.celery.worker.breaker import lookup as breaker_lookup
from celery_ratchet.celery.worker.breaker import parse as parse_breaker
from celery_ratchet.celery.worker.remote import RemoteCommands
from celery_ratchet.celery.worker.retry import install_retries
from celery_ratchet.celery.worker.transport import wake as wake_main_loop
from celery_ratchet.errors import (
    ConfigurationError,
    SchemaMissing,
    SchemaNotCreated,
    SchemaOutdated,
    StoreBusy,
    StoreUnavailable,
)
from celery_ratchet.runtime.dlq import DeadLetterAlerts
from celery_ratchet.runtime.fence import current_fence
from celery_ratchet.runtime.worker import WorkerRuntime
from celery_ratchet.store.database import quiet_outages
from celery_ratchet.store.job_rows import REVOKE_ONLY

logger = logging.getLogger(__name__)


#: The exit status of a worker whose job store's schema stops it (sysexits' EX_CONFIG).
EX_CONFIG = 78


class CannotStart(SystemExit):
    """A worker stopped at its start by what no retry can fix (the job store's tables): a
    ``SystemExit``, which Celery's worker takes as its exit status without a traceback."""


class JobConsumer(bootsteps.StartStopStep):
    """Claims due jobs for this worker's queues and hands them to Celery."""

    label = "Ratchet"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, c: Any, **kwargs: Any) -> None:
        super().__init__(c, **kwargs)
        self.runtime: WorkerRuntime | None = None
        # Made before the pool forks, so that its processes share it.
        self.fence = current_fence()
        app = c.app
        signals.worker_process_init.connect(
            lambda **_: _in_pool_process(app),
            weak=False,
            dispatch_uid=f"ratchet-pool-process-{id(app)}",
        )
        reset_stop()

    def _on_shutting_down(self, sender: Any = None, how: str = "Warm", **_: Any) -> None:
        request_stop(cold=how == "Cold")
        wake_main_loop()
        if self.runtime is not None:
            self.runtime.request_stop()

    def start(self, c: Any) -> None:
        # The Tasks step has just built the tracers again: each checks the claim first.
        fence_tracers(c.app)
        if self.runtime is not None:  # the consumer restarted: keep the same node
            self.runtime.resume()
            return
        try:
            self._start(c)
        except (SchemaMissing, SchemaNotCreated, SchemaOutdated) as exc:
            # Its message says what to do; the driver's traceback and SQL under it would
            # bury that (Celery logs an Unrecoverable error with its traceback otherwise).
            logger.critical("ratchet: the worker cannot start: %s", exc)
            raise CannotStart(EX_CONFIG) from None

    def _start(self, c: Any) -> None:
        app = c.app
        state = ratchet_state(app)
        _report_outcomes_to_store(app)
        with _refused_start():
            _check_task_options(app, state.settings)
        _warn_refused_serializers(app, state.settings.allow_pickle)
        install_retries(app)
        c.update_strategies()
        fence_tracers(app)
        # Sent from the stop signal's handler: from then on no job starts, whatever the
        # worker's main loop is doing (it notices the stop only between two waits).
        signals.worker_shutting_down.connect(self._on_shutting_down, weak=False)
        with _refused_start():
            _register_recurring(app)
        dispatcher = Dispatcher(c)
        runtime = WorkerRuntime(
            state.store,
            state.settings,
            node_id=f"{c.hostname}/{os.getpid()}/{uuid.uuid4().hex[:8]}",
            queues=sorted(app.amqp.queues.consume_from),
            capacity=capacity_for(c),
            dispatch=dispatcher,
            occurrence=occurrence,
            hostname=c.hostname,
            breaker_for=breaker_lookup(app),
            on_revoke=functools.partial(_revoke_started, c),
            revoked_error=exception_record(TaskRevokedError("revoked")),
            wakeups=state.wakeup_sources(),
            housekeeping=functools.partial(
                _housekeeping, app, dead_letter_alerts(app), BeatOwnership(app)
            ),
            fence=self.fence,
            control=RemoteCommands(c),
            schedule_keys=list(app.conf.beat_schedule or {}),
            # Said so that a node of another release hands it the jobs of the tasks it has.
            task_names=sorted(app.tasks),
            clock=state.clock,
        )
        dispatcher.runtime = runtime
        self.runtime = state.runtime = runtime
        # A job still waiting for its turn when the worker stops does not start.
        guard(c.pool, refused=runtime.hand_back)
        # Outcomes keep arriving while the pool drains; leave the cluster only after that.
        signals.worker_shutdown.connect(self._on_worker_shutdown, weak=False)
        runtime.start()

    def stop(self, c: Any) -> None:
        if self.runtime is not None:
            self.runtime.stop_claiming()

    def shutdown(self, c: Any) -> None:
        # After the pool stopped (warm or cold): every outcome it will report is in.
        self.stop(c)
        if self.runtime is not None:
            self.runtime.close()

    def _on_worker_shutdown(self, sender: Any = None, **_: Any) -> None:
        signals.worker_shutdown.disconnect(self._on_worker_shutdown)
        signals.worker_shutting_down.disconnect(self._on_shutting_down)
        if self.runtime is not None:
            self.runtime.close()


def _in_pool_process(app: Any) -> None:
    """A pool process starts: its tasks check their claims before running; the store's
    outages are logged by the worker's main process, not again by each pool process."""
    fence_tracers(app)
    quiet_outages()


def _revoke_started(consumer: Any, job_id: str, request: str) -> None:
    """A revoke of a job this worker has handed to Celery: Celery's own revoke, as its remote
    control would do it. Still queued for a pool process: terminated the moment a process
    takes it (prefork), so it does not run. Running: terminated if asked, where the pool can."""
    worker_state.revoked.add(job_id)
    queued = worker_state.requests.get(job_id)
    if queued is None:
        return
    started = queued.time_start is not None
    if started and request == REVOKE_ONLY:
        return
    # Terminated already by the revoke broadcast's own handler (`celery control terminate`).
    if request_already_revoked(queued) or request_terminates_on_ack(queued):
        return
    pool = consumer.pool
    # Prefork sets terminate_job on the instance when it starts; the base one only raises.
    if getattr(pool.terminate_job, "__func__", None) is BasePool.terminate_job:
        logger.warning(
            "ratchet: the %s pool cannot terminate job %s; it runs to its end",
            type(pool).__name__,
            job_id,
        )
        return
    sig = "SIGTERM" if request == REVOKE_ONLY else request
    logger.info("ratchet: terminating job %s (%s)", job_id, sig)
    queued.terminate(pool, signal=platform_signals.signum(sig))


def _housekeeping(app: Any, alerts: DeadLetterAlerts | None, beat: BeatOwnership) -> None:
    """Finish stalled batches, fail abandoned streams, send the dead-letter alerts due and
    keep beat_schedule's entries owned; one failing does not keep the others from running."""
    try:
        streams.housekeeping(app)
    finally:
        try:
            if alerts is not None:
                sent = alerts.send_due()
                if sent:  # PostgreSQL's insert notified already; Redis wake-ups are told here
                    ratchet_state(app).published(sorted({job.queue for job in sent}))
        finally:
            beat()


@contextlib.contextmanager
def _refused_start() -> Iterator[None]:
    """A configuration the worker cannot start with (a task's options, a beat_schedule
    entry) stops it with its message alone: Celery would log any exception as an
    "Unrecoverable error" with a traceback of its own start, which says nothing more."""
    try:
        yield
    except ConfigurationError as exc:
        logger.critical("ratchet: the worker does not start: %s", exc)
        raise SystemExit(EX_FAILURE) from exc


def _register_recurring(app: Any) -> None:
    """Register the app's recurring jobs (``@recurring``, ``beat_schedule``) before claiming;
    waits for an unreachable store instead of starting without its schedules, unless the
    worker is told to stop meanwhile (then it stops, having claimed nothing)."""
    delay = 1.0
    while True:
        worker_state.maybe_shutdown()
        try:
            keys = register_all(app) + register_archiver(app)
            break
        except (StoreUnavailable, StoreBusy) as exc:
            logger.warning("ratchet: recurring jobs not registered yet (%s); retrying", exc)
            deadline = time.monotonic() + delay
            while time.monotonic() < deadline:
                worker_state.maybe_shutdown()
                time.sleep(0.1)
            delay = min(delay * 2, 30.0)
    if keys:
        logger.info("ratchet: %d recurring jobs registered: %s", len(keys), ", ".join(keys))


def _check_task_options(app: Any, settings: Any) -> None:
    """Refuse to start on a task whose ratchet options are wrong in themselves (an unknown
    backoff, a malformed circuit breaker), rather than fail its jobs. A resource this worker
    has no capacity for is only logged: such jobs are left to workers configured for it."""
    problems = []
    for task in app.tasks.values():
        if task.name.startswith("celery."):
            continue
        try:
            options = resolve_options(task.name, task, None, settings, require_capacity=False)
            parse_breaker(getattr(task, "circuit_breaker", None), task.name)
        except (ValueError, TypeError) as exc:
            problems.append(f"{task.name}: {exc}")
            continue
        resource = options.get("resource")
        if resource is not None and resource not in settings.resources:
            logger.warning(
                "ratchet: task %s needs resource %r, which has no capacity on this worker "
                "(ratchet_resources); workers configured for it run those jobs",
                task.name,
                resource,
            )
    if problems:
        raise ConfigurationError(
            "ratchet options of tasks are invalid:\n  " + "\n  ".join(problems)
        )
    alert_task = settings.dlq_alert_task
    if alert_task is not None and alert_task not in app.tasks:
        logger.warning(
            "ratchet: ratchet_dlq_alert_task %r is not a task registered on this worker; "
            "its alerts are sent, but only a worker that has it can run them",
            alert_task,
        )


def _warn_refused_serializers(app: Any, allow_pickle: bool) -> None:
    refused = getattr(ratchet_state(app), "refused_serializers", None)
    if refused is None:  # the worker was not started by `celery worker` (no celeryd_init)
        _, refused = safe_accept(app.conf.accept_content, allow_pickle)
    if refused:
        logger.warning(
            "ratchet: accept_content (or result_accept_content) lists %s, but "
            "ratchet_allow_pickle is off: this worker refuses them, and a job stored with "
            "them is FAILED without running. Set "
            "ratchet_allow_pickle = True only if every process that can write to the job "
            "store is trusted",
            ", ".join(refused),
        )


def _report_outcomes_to_store(app: Any) -> None:
    """Every task, whatever its base class, reports its end to the store."""
    for task in app.tasks.values():
        request_cls = symbol_by_name(task.Request)
        task.Request = ratchet_request_class(request_cls)
