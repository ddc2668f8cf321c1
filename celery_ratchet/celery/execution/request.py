"""Celery's worker Request, reporting each execution's end to the job store.

Celery decides what happened (success, failure, retry, revoke, reject, time limit, lost child);
these hooks report each outcome to the execution's :class:`JobMessage`, which settles the
claimed row. The first outcome wins; later ones for the same execution are ignored.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from billiard.einfo import ExceptionInfo, ExceptionWithTraceback
from billiard.exceptions import WorkerLostError
from celery.exceptions import Ignore, Retry, TaskRevokedError, Terminated, TimeLimitExceeded
from celery.worker.request import Request
from celery.worker.state import task_ready

from celery_ratchet.celery.compat import request_already_cancelled, request_already_revoked
from celery_ratchet.celery.execution.fencing import ClaimGone, ClaimUnconfirmed
from celery_ratchet.celery.execution.job_message import JobMessage, retry_of
from celery_ratchet.celery.execution.stopping import RUNNING, HandedBack, stop_mode
from celery_ratchet.celery.results.backend import RatchetBackend, exception_record
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.celery.worker.retry import decision_for
from celery_ratchet.domain.job import JobStatus
from celery_ratchet.errors import StoreUnavailable

logger = logging.getLogger(__name__)


def _unwrap(exc: BaseException) -> BaseException:
    return exc.exc if isinstance(exc, ExceptionWithTraceback) else exc


class RatchetRequest(Request):
    @property
    def eta(self) -> None:
        """The store held the job until its ETA; Celery's timer must not hold it again (it
        wakes once a second, and a past ETA would still wait for it). ``self.request.eta``
        keeps the time: it comes from the message headers, not from here."""
        return None

    def info(self, safe: bool = False) -> dict[str, Any]:
        """Celery's listing (``inspect active``, ``query_task``), with the priority the
        job's message carried, as stock reports it, not the row's (its default when the
        sender gave none)."""
        info: dict[str, Any] = super().info(safe=safe)
        message = self.message
        if isinstance(message, JobMessage) and isinstance(info.get("delivery_info"), dict):
            info["delivery_info"] = {**info["delivery_info"], "priority": message.sent_priority}
        return info

    def _end(
        self,
        status: JobStatus | None,
        exc: BaseException | None = None,
        traceback: str | None = None,
        *,
        failed: bool | None = None,
    ) -> None:
        message = self.message
        if isinstance(message, JobMessage):
            error = exception_record(exc) if exc is not None else None
            message.end(status, error, traceback, failed=failed)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        # Celery's strategy subclasses the task's Request class with an optimised on_success
        # that does not call up (celery.worker.request.create_request_cls); wrap it there too.
        super().__init_subclass__(**kwargs)
        if "on_success" in cls.__dict__:
            cls.on_success = _reporting_success(cls.__dict__["on_success"])  # type: ignore

    def on_success(self, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        failed = failed__retval__runtime[0]
        try:
            return super().on_success(failed__retval__runtime, **kwargs)
        finally:
            if not failed:
                self._end_success()

    def _end_success(self) -> None:
        # Where the task's result went to the store, that write already finished the row.
        stored = not self.ignore_result and isinstance(self.task.backend, RatchetBackend)
        self._end(None if stored else JobStatus.SUCCEEDED, failed=False)

    def on_failure(
        self, exc_info: ExceptionInfo, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = _unwrap(exc_info.exception)
        stopping = stop_mode() != RUNNING
        if isinstance(exc, HandedBack) or (
            stopping and isinstance(exc, (Terminated, WorkerLostError))
        ):
            # Not started before the stop, or cut off by it (its process was terminated
            # or killed as the worker stopped): back to PENDING at once, not failed.
            task_ready(self)
            self._end(JobStatus.PENDING)
            return None
        if isinstance(exc, StoreUnavailable) and stopping:
            # Its outcome could not be written before the stop: the row stays RUNNING and
            # comes back through orphan recovery, as if this worker had died.
            logger.error(
                "ratchet: job %s ended while the job store was unreachable and the worker "
                "is stopping; it stays RUNNING until orphan recovery hands it back",
                self.id,
            )
            task_ready(self)
            self._end(None)
            return None
        # The pool reports a hard time limit here, before on_timeout: decide the retry first.
        if isinstance(exc, TimeLimitExceeded) and self._retry_after(exc):
            return None
        try:
            return super().on_failure(
                exc_info, send_failed_event=send_failed_event, return_ok=return_ok
            )
        finally:
            if isinstance(exc, Retry):
                self._end(None, failed=True)  # the retry already rescheduled the row
            elif isinstance(exc, ClaimGone):
                self._end(None)  # not started: the job is another node's now
            elif isinstance(exc, ClaimUnconfirmed):
                self._end(JobStatus.PENDING)  # not started: handed back
            elif isinstance(exc, Ignore):
                self._end(JobStatus.IGNORED)
            elif isinstance(exc, Terminated):
                self._end(JobStatus.REVOKED, exc)
            elif isinstance(exc, (SystemExit, KeyboardInterrupt)) and (
                request_already_cancelled(self) or request_already_revoked(self)
            ):
                self._end(JobStatus.PENDING)
            else:
                self._end(JobStatus.FAILED, exc, str(exc_info.traceback or "") or None)

    def on_timeout(self, soft: bool, timeout: float) -> None:
        if not soft and self._retry_after(TimeLimitExceeded(timeout)):
            return
        try:
            super().on_timeout(soft, timeout)
        finally:
            if not soft:
                self._end(JobStatus.FAILED, TimeLimitExceeded(timeout))

    def _retry_after(self, exc: BaseException) -> bool:
        """A failure the task never saw (its process was killed at the hard time limit)
        goes through the same retry decision as one it raised: reschedule the row."""
        message = self.message
        if not isinstance(message, JobMessage):
            return False
        runtime = ratchet_state(self.task.app).runtime
        if runtime is not None and runtime.unwritten(message.job.job_id, message.job.token):
            return False  # it succeeded, and its result waits for the settler
        request = SimpleNamespace(**{str(k): v for k, v in self.request_dict.items()})
        decision = decision_for(self.task.app, self.task, request, exc)
        if decision is None or not decision.retry:
            return False
        retried = retry_of(message.job, decision.delay, ratchet_state(self.task.app).clock.now())
        if not ratchet_state(self.task.app).store.replace_running(message.job.token, retried):
            return False
        logger.warning(
            "ratchet: task %s[%s] %s; retry %d in %.1fs",
            self.task.name, self.id, exc, retried.attempts, decision.delay,
        )  # fmt: skip
        self._end(None, failed=True)
        return True

    def _announce_revoked(self, reason: str, terminated: bool, signum: Any, expired: bool) -> None:
        """Celery's (``compat.REQUEST_ANNOUNCE_REVOKED_METHOD``), then the row is revoked."""
        try:
            super()._announce_revoked(reason, terminated, signum, expired)
        finally:
            self._end(JobStatus.REVOKED, TaskRevokedError(reason))


def _reporting_success(on_success: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(on_success)
    def wrapper(self: RatchetRequest, failed__retval__runtime: Any, **kwargs: Any) -> Any:
        try:
            return on_success(self, failed__retval__runtime, **kwargs)
        finally:
            if not failed__retval__runtime[0]:
                self._end_success()

    return wrapper


def ratchet_request_class(base: type[Request]) -> type[Request]:
    """``base`` itself if it already reports to the store, else a subclass that does."""
    if issubclass(base, RatchetRequest):
        return base
    return type(f"Ratchet{base.__name__}", (RatchetRequest, base), {})
