"""Remote control for a ratchet app: revoke and purge act on the store, and every broadcast
(``celery inspect``, ``celery control``, ``celery status``) travels through the store to the
workers, which answer with Celery's own handlers."""

from __future__ import annotations

import logging
from signal import Signals
from typing import Any

from billiard.common import TERM_SIGNAME
from celery.app.control import Control
from celery.exceptions import TaskRevokedError
from celery.platforms import signals as platform_signals

from celery_ratchet.celery.control.mailbox import DEFAULT_COMMAND_TTL, broadcast_through_store
from celery_ratchet.celery.results.backend import exception_record
from celery_ratchet.celery.state import ratchet_state
from celery_ratchet.domain.control import CONTROL_WAKEUP
from celery_ratchet.domain.job import REVOCATIONS_WAKEUP

logger = logging.getLogger(__name__)

#: How long a revoke by stamped headers waits for the live workers to take the stamps in.
_STAMPS_WAIT = 1.0


class RatchetControl(Control):
    def revoke(
        self,
        task_id: str | list[str],
        destination: Any = None,
        terminate: bool = False,
        signal: Any = None,
        **kwargs: Any,
    ) -> Any:
        """Revoke jobs: pending ones never run; running ones are dropped by their worker if
        not started yet, and with ``terminate=True`` terminated with ``signal`` (default
        SIGTERM) where the pool allows (prefork). The workers are told as Celery's are (their
        revoked lists, ``task-revoked``). Returns how many jobs were reached, or with
        ``reply=True`` the workers' replies, as Celery does."""
        reached = self._revoke_in_store(task_id, terminate, signal)
        replies = self._send(
            "revoke",
            {"task_id": task_id, "terminate": terminate, "signal": signal},
            destination,
            **kwargs,
        )
        return replies if kwargs.get("reply") else reached

    def revoke_by_stamped_headers(
        self,
        headers: Any,
        destination: Any = None,
        terminate: bool = False,
        signal: Any = TERM_SIGNAME,
        **kwargs: Any,
    ) -> Any:
        """Celery's revoke by stamped headers. Without ``reply``, it still waits (up to
        ``timeout``, one second when it is not given or None) until each live worker has
        taken the stamps in, so that a job sent after it returns is revoked: a worker reads
        broadcasts between claims, and would otherwise run such a job before it learnt of
        the revocation."""
        if kwargs.get("reply"):
            return super().revoke_by_stamped_headers(
                headers, destination, terminate, signal, **kwargs
            )
        nodes = len(destination) if destination else len(ratchet_state(self.app).store.list_nodes())
        if nodes:
            # AsyncResult.revoke_by_stamped_headers passes timeout=None: no wait at all
            timeout = kwargs.get("timeout")
            kwargs.update(
                reply=True,
                limit=kwargs.get("limit") or nodes,
                timeout=_STAMPS_WAIT if timeout is None else timeout,
            )
        super().revoke_by_stamped_headers(headers, destination, terminate, signal, **kwargs)
        return None

    def _revoke_in_store(self, task_id: str | list[str], terminate: bool, signal: Any) -> int:
        """Pending jobs become REVOKED; running ones are marked, so that their node drops
        them if not started yet. Terminating a started job is left to the broadcast, whose
        handler (Celery's) terminates it and says so in its reply."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        store = ratchet_state(self.app).store
        if terminate:
            _signal_name(signal)  # an unknown signal is refused before anything changes
        touched: list[str] = []
        pending, running = store.request_revoke(
            ids, exception_record(TaskRevokedError("revoked")), batches=touched
        )
        if running:  # their nodes check at once (PostgreSQL: the store notified already)
            ratchet_state(self.app).published([REVOCATIONS_WAKEUP])
        if touched:  # a chord whose last pending children were revoked fails now
            from celery_ratchet.celery.canvas.batches import finish_ready

            finish_ready(self.app, touched)
        if pending + running < len(ids):
            logger.info(
                "ratchet: %d of %d jobs were already finished (or unknown) and were left alone",
                len(ids) - pending - running,
                len(ids),
            )
        return pending + running

    def purge(self, connection: Any = None) -> int:
        """Delete every pending job of the app's queues; returns how many."""
        queues = sorted(self.app.amqp.queues.consume_from)
        return ratchet_state(self.app).store.purge_pending(queues)

    discard_all = purge

    def broadcast(
        self,
        command: str,
        arguments: Any = None,
        destination: Any = None,
        connection: Any = None,
        reply: bool = False,
        timeout: float = 1.0,
        limit: int | None = None,
        callback: Any = None,
        channel: Any = None,
        pattern: str | None = None,
        matcher: str | None = None,
        **extra_kwargs: Any,
    ) -> Any:
        """Celery's broadcast, through the job store: the command is written for the
        workers, each addressed worker runs it with Celery's own handler and writes its
        reply, gathered here as Celery gathers them (each reply waited for ``timeout``
        seconds at most, ``limit`` replies at most)."""
        arguments = dict(arguments or {}, **extra_kwargs)
        _check_destination(destination)
        if command in ("revoke", "terminate"):  # the store's revoke holds whatever happens
            self._revoke_in_store(
                arguments.get("task_id") or [],
                command == "terminate" or bool(arguments.get("terminate")),
                arguments.get("signal"),
            )
        return self._send(
            command,
            arguments,
            destination,
            reply=reply,
            timeout=timeout,
            limit=limit,
            callback=callback,
            pattern=pattern,
            matcher=matcher,
        )

    def _send(
        self,
        command: str,
        arguments: dict[str, Any],
        destination: Any,
        *,
        reply: bool = False,
        timeout: float = 1.0,
        limit: int | None = None,
        callback: Any = None,
        pattern: str | None = None,
        matcher: str | None = None,
        **_: Any,
    ) -> Any:
        _check_destination(destination)
        state = ratchet_state(self.app)
        ttl = float(self.app.conf.control_queue_ttl or DEFAULT_COMMAND_TTL)
        return broadcast_through_store(
            state.store.control,
            command,
            arguments,
            destination=list(destination) if destination else None,
            pattern=pattern if pattern and matcher else None,
            matcher=matcher if pattern and matcher else None,
            reply=reply,
            timeout=timeout,
            limit=limit,
            callback=callback,
            ttl_seconds=max(ttl, timeout or 0.0),
            announce=lambda: state.published([CONTROL_WAKEUP]),
        )


def _check_destination(destination: Any) -> None:
    if destination is not None and not isinstance(destination, (list, tuple)):
        raise ValueError(f"destination must be a list/tuple not {type(destination)}")


def _signal_name(signal: Any) -> str:
    """``SIGTERM`` for None, 15, "TERM" or "SIGTERM"; unknown signals are refused."""
    if signal is None:
        return "SIGTERM"
    if isinstance(signal, int):
        return Signals(signal).name
    name = str(signal).upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    try:
        platform_signals.signum(name)
    except (AttributeError, TypeError, ValueError):
        raise ValueError(
            f"revoke: unknown signal {signal!r} (try 'SIGTERM' or 'SIGKILL')"
        ) from None
    return name
