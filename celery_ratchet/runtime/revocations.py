"""Revokes of jobs a node holds: dropped before they start, or handed on to be terminated."""

from __future__ import annotations

import logging

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    Settlement,
)
from celery_ratchet.runtime.outcomes import Outcomes

logger = logging.getLogger(__name__)


class Revocations(Outcomes):
    """Revokes of jobs a node holds: dropped before they start, or handed on to be terminated."""

    def _drop_revoked(self, claimed: list[ClaimedJob]) -> list[ClaimedJob]:
        """Jobs revoked while an earlier execution of theirs ran (a retry, a hand-back):
        they end REVOKED here instead of running again."""
        revoked = [job for job in claimed if job.revoke_requested is not None]
        for job in revoked:
            logger.info("ratchet: job %s was revoked; not running it again", job.job_id)
            self._report_revoked(job)
        return revoked

    def _report_revoked(self, job: ClaimedJob) -> None:
        self._report(
            Settlement(job.job_id, job.token, JobStatus.REVOKED, self.revoked_error,
                       resource=job.resource)
        )  # fmt: skip

    def _holds_jobs(self) -> bool:
        with self._lock:
            return bool(self._in_flight or self._ready)

    def _revocation_wait(self) -> bool | None:
        """Until a revoke is announced (True) or the next look is due (False); None once
        closed. Wakes a few times a second to notice the close, without touching the store."""
        deadline = self._clock.monotonic() + self._idle_look
        while not self._closed.is_set():
            if self._revoke_hint.wait(max(0.0, min(deadline - self._clock.monotonic(), 0.2))):
                self._revoke_hint.clear()
                return True
            if self._clock.monotonic() >= deadline:
                return False
        return None

    def _revocation_loop(self) -> None:
        """Revokes asked while a job of this node was RUNNING: a job not started yet is
        dropped (REVOKED); a started one is handed to ``on_revoke`` (terminate, if asked).
        Looked for every poll interval (with a wake-up channel: when announced, and every
        ``wakeup_poll_interval``), and only while this node holds jobs: an idle node has
        nothing to stop."""
        handled: set[tuple[str, str]] = set()
        while (announced := self._revocation_wait()) is not None:
            # An announced revoke is always looked up: the job may be claimed already and
            # on its way into this node's buffer.
            if not announced and not self._holds_jobs():
                handled.clear()
                continue
            try:
                asked = self.store.revocations(self.node_id)
            except Exception as exc:
                self._throttle.warn("revocations", "ratchet: revokes not checked: %s", exc)
                continue
            for job_id, token, request in asked:
                if (job_id, token) not in handled:
                    handled.add((job_id, token))
                    self._revoke(job_id, token, request)
            handled &= {(job_id, token) for job_id, token, _ in asked}

    def _revoke(self, job_id: str, token: str, request: str) -> None:
        with self._lock:
            buffered = next(
                (j for j in self._ready if j.job_id == job_id and j.token == token), None
            )
            if buffered is not None:
                self._ready.remove(buffered)
            started = self._in_flight.get(job_id) == token
        if buffered is not None:
            logger.info("ratchet: job %s revoked before it started", job_id)
            self._report_revoked(buffered)
        elif started and self.on_revoke is not None:
            try:
                self.on_revoke(job_id, request)
            except Exception:
                logger.exception("ratchet: revoke of job %s failed", job_id)
