"""Remote control for a ratchet app: revoke and purge act on the store; broadcasts have no
broker to travel on and return no replies."""

from __future__ import annotations

import logging
from typing import Any

from celery.app.control import Control
from celery.exceptions import TaskRevokedError

from celery_ratchet.celery.app import ratchet_state
from celery_ratchet.celery.backend import exception_record

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
        """Revoke pending jobs: they will never run. Running jobs finish (terminating them is
        not supported yet) and are reported in the log."""
        ids = [task_id] if isinstance(task_id, str) else list(task_id)
        store = ratchet_state(self.app).store
        revoked = store.revoke_pending(ids, exception_record(TaskRevokedError("revoked")))
        if revoked < len(ids):
            logger.info(
                "ratchet: %d of %d jobs were not pending (running or finished) and were left alone",
                len(ids) - revoked,
                len(ids),
            )
        return revoked

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
        logger.debug("ratchet: no broker, broadcast %r reaches no worker", command)
        return [] if reply else None
