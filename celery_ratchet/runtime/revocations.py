"""Revokes of jobs a node holds: dropped before they start, or handed on to be terminated."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    Settlement,
)
from celery_ratchet.runtime.base import NodeEvents, Throttle
from celery_ratchet.runtime.channel import Channel
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.runtime.holdings import Holdings
from celery_ratchet.runtime.outcomes import Settler
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import RevocationStore

logger = logging.getLogger(__name__)


class Revocations:
    """Owns the revocations thread and what it handled; :meth:`hint` is thread-safe."""

    def __init__(
        self,
        store: RevocationStore,
        settings: RatchetSettings,
        *,
        node_id: str,
        holdings: Holdings,
        events: NodeEvents,
        channel: Channel,
        settler: Settler,
        on_revoke: Callable[[str, str], None] | None,
        revoked_error: str | None,
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id
        self._holdings = holdings
        self._events = events
        self._channel = channel
        self._settler = settler
        #: Called with (job id, ``REVOKE`` or a signal name) for a started job to stop.
        self.on_revoke = on_revoke
        self.revoked_error = revoked_error
        self._clock = clock
        self._throttle = throttle
        self._hint = threading.Event()  # a running job may have been asked to stop
        self._handled: set[tuple[str, str]] = set()

    def hint(self) -> None:
        """A running job may have been asked to stop: look now."""
        self._hint.set()

    def drop_revoked(self, claimed: list[ClaimedJob]) -> list[ClaimedJob]:
        """Jobs revoked while an earlier execution of theirs ran (a retry, a hand-back):
        they end REVOKED here instead of running again."""
        revoked = [job for job in claimed if job.revoke_requested is not None]
        for job in revoked:
            logger.info("ratchet: job %s was revoked; not running it again", job.job_id)
            self._report_revoked(job)
        return revoked

    def _report_revoked(self, job: ClaimedJob) -> None:
        self._settler.report(
            Settlement(job.job_id, job.token, JobStatus.REVOKED, self.revoked_error,
                       resource=job.resource)
        )  # fmt: skip

    def _wait(self) -> bool | None:
        """Until a revoke is announced (True) or the next look is due (False); None once
        closed. Wakes a few times a second to notice the close, without touching the store."""
        closed = self._events.closed
        deadline = self._clock.monotonic() + self._channel.idle_look()
        while not closed.is_set():
            if self._hint.wait(max(0.0, min(deadline - self._clock.monotonic(), 0.2))):
                self._hint.clear()
                return True
            if self._clock.monotonic() >= deadline:
                return False
        return None

    def run(self) -> None:
        """Revokes asked while a job of this node was RUNNING: a job not started yet is
        dropped (REVOKED); a started one is handed to ``on_revoke`` (terminate, if asked).
        Looked for every poll interval (with a wake-up channel: when announced, and every
        ``wakeup_poll_interval``), and only while this node holds jobs: an idle node has
        nothing to stop."""
        while (announced := self._wait()) is not None:
            self.look(announced=announced)

    def look(self, *, announced: bool) -> None:
        """One look for revokes. An announced revoke is always looked up: the job may be
        claimed already and on its way into this node's buffer."""
        if not announced and not self._holdings.holds_jobs():
            self._handled.clear()
            return
        try:
            asked = self.store.revocations(self.node_id)
        except Exception as exc:
            self._throttle.warn("revocations", "ratchet: revokes not checked: %s", exc)
            return
        for job_id, token, request in asked:
            if (job_id, token) not in self._handled:
                self._handled.add((job_id, token))
                self._revoke(job_id, token, request)
        self._handled &= {(job_id, token) for job_id, token, _ in asked}

    def _revoke(self, job_id: str, token: str, request: str) -> None:
        buffered = self._holdings.take_buffered(job_id, token)
        if buffered is not None:
            logger.info("ratchet: job %s revoked before it started", job_id)
            self._report_revoked(buffered)
        elif self._holdings.started(job_id, token) and self.on_revoke is not None:
            try:
                self.on_revoke(job_id, request)
            except Exception:
                logger.exception("ratchet: revoke of job %s failed", job_id)
