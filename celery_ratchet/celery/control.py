"""Remote control for a ratchet app: revoke and purge act on the store, ``ping`` answers from
the workers' heartbeats; other broadcasts have no broker to travel on and get no replies."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from signal import Signals
from typing import Any

from celery.app.control import Control
from celery.exceptions import TaskRevokedError
from celery.platforms import signals as platform_signals

from celery_ratchet.celery.app import ratchet_state
from celery_ratchet.celery.backend import exception_record
from celery_ratchet.domain.job import REVOCATIONS_WAKEUP

logger = logging.getLogger(__name__)


class RatchetControl(Control):
    def revoke(
        self,
        task_id: str | list[str],
        destination: Any = None,
        terminate: bool = False,
        signal: Any = None,
        **kwargs: Any,
    ) -> int:
        """Revoke jobs: pending ones never run; running ones are dropped by their worker if
        not started yet, and with ``terminate=True`` terminated with ``signal`` (default
        SIGTERM) where the pool allows (prefork). Returns how many jobs were reached."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        store = ratchet_state(self.app).store
        sig = _signal_name(signal) if terminate else None
        touched: list[str] = []
        pending, running = store.request_revoke(
            ids,
            exception_record(TaskRevokedError("revoked")),
            terminate_signal=sig,
            batches=touched,
        )
        if running:  # their nodes check at once (PostgreSQL: the store notified already)
            ratchet_state(self.app).published([REVOCATIONS_WAKEUP])
        if touched:  # a chord whose last pending children were revoked fails now
            from celery_ratchet.celery.batches import finish_ready

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
        **kwargs: Any,
    ) -> Any:
        if command == "ping" and reply:
            return self._ping(destination)
        logger.debug("ratchet: no broker, broadcast %r reaches no worker", command)
        return [] if reply else None

    def _ping(self, destination: Any) -> list[dict[str, Any]]:
        """``inspect().ping()``: the worker nodes whose heartbeat is recent, from the store."""
        state = ratchet_state(self.app)
        grace = state.settings.node_orphan_grace_seconds
        now = datetime.now(timezone.utc)
        wanted = None if destination is None else set(destination)
        replies = []
        for node in state.store.list_nodes():
            name = node["hostname"]
            fresh = (now - node["heartbeat_ts"]).total_seconds() <= grace
            if fresh and (wanted is None or name in wanted):
                replies.append({name: {"ok": "pong"}})
        return replies


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
