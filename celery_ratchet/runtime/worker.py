"""The worker's database side: claim, hand over, record outcomes, heartbeat, recover orphans.

Knows nothing of Celery: it is given a ``dispatch`` callable that starts one claimed job and
must eventually be told the outcome through :meth:`WorkerRuntime.settle`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from celery_ratchet.domain.job import (
    ClaimedJob,
    JobStatus,
    Settlement,
)
from celery_ratchet.runtime.base import (
    _CLOSED,
    SHUTDOWN_WRITE_SECONDS,
    Capacity,
)
from celery_ratchet.runtime.liveness import Liveness

logger = logging.getLogger(__name__)


class WorkerRuntime(Liveness):
    """One node of the cluster and its lifecycle. Each concern of its work is a part in a
    module of its own: claiming, recurring masters, outcomes, revocations, liveness."""

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._stop_relay.start()
        registered = self._register()
        if registered is None:  # told to stop before it could register: claim nothing
            return
        for name, target in (
            ("poller", self._poll_loop),
            ("settler", self._settle_loop),
            ("heartbeat", self._heartbeat_loop),
            ("orphan-scan", self._orphan_loop),
            ("revocations", self._revocation_loop),
            ("housekeeping", self._housekeeping_loop),
        ):
            self._spawn(name, target)
        if self.control is not None:
            # From the first registration, not from now: a job claimed meanwhile may already
            # be the subject of a broadcast (a revoke with terminate).
            self.control.start(since=registered)
        for source in self.wakeups:
            source.start(self._woken)

    def resume(self) -> None:
        """Claim again after :meth:`stop_claiming` (the executor restarted)."""
        if self._closed.is_set() or not self._stopping.is_set():
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        self._ended = {t: e for t, e in self._ended.items() if t in self._threads}
        running = {t.name for t in self._threads}
        if {"ratchet-poller", "ratchet-orphan-scan"} & running:
            logger.warning("ratchet: previous claim loop still stopping; not resuming yet")
            return
        self._stopping.clear()
        self._spawn("poller", self._poll_loop)
        self._spawn("orphan-scan", self._orphan_loop)

    def set_queues(self, queues: Sequence[str]) -> None:
        """Claim from ``queues`` from now on (``celery control add_consumer`` and
        ``cancel_consumer``); the node's row lists them."""
        self.queues = list(queues)
        try:
            self.store.set_node_queues(self.node_id, self.queues)
        except Exception as exc:  # only the listing is behind; claims use the new queues
            self._throttle.warn("queues", "ratchet: node queues not recorded: %s", exc)
        logger.info("ratchet: node %s consuming %s", self.node_id, ",".join(self.queues))
        self.wake()

    def set_capacity(self, capacity: Capacity) -> None:
        """Take this much work from now on (the pool grew or shrank)."""
        self.capacity = capacity
        logger.info(
            "ratchet: node %s runs %d jobs at once, %d handed to the executor",
            self.node_id,
            capacity.executing,
            capacity.running,
        )
        self.wake()

    def request_stop(self) -> None:
        """Start no more jobs, from now on; :meth:`stop_claiming` then waits for the claim
        loop and hands the buffer back. Safe in a signal handler, which may have interrupted
        this thread inside ``set()`` of these very events: a thread of their own sets them."""
        if self._stop_relay.running:
            self._stop_relay.pull()
        elif not self._closed.is_set():  # not started: no thread of this node runs yet
            self._stopping.set()
            self._wake.set()

    def stop_claiming(self) -> list[ClaimedJob]:
        """Stop taking work and hand claimed-but-unstarted jobs back at once."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            if thread.name == "ratchet-poller":
                self._wait_until_ended(thread, 30)
        with self._lock:
            unstarted = list(self._ready)
            self._ready.clear()
        try:
            # As if never claimed, due when they were: a rolling restart that hands the same
            # job back from node after node does not count against ratchet_max_recoveries.
            if unstarted:
                self.store.defer([(j.job_id, j.token, j.scheduled_time) for j in unstarted])
                self._announce(self.queues)
        except Exception:  # unreachable or refused: the settler hands them back, or recovery
            for job in unstarted:
                self._report(
                    Settlement(job.job_id, job.token, JobStatus.PENDING, resource=job.resource)
                )
        if unstarted:
            logger.info("ratchet: handing back %d unstarted jobs", len(unstarted))
        return unstarted

    def hand_back(self, job_id: str) -> None:
        """A job handed to the executor that will never start it (it was closing): back to
        PENDING now."""
        with self._lock:
            token = self._in_flight.get(job_id)
        if token is not None:
            self._report(self._with_permit(Settlement(job_id, token, JobStatus.PENDING)))
            self._free(job_id, token)
            logger.info("ratchet: handing back job %s, which the executor refused", job_id)

    def close(self, timeout: float = SHUTDOWN_WRITE_SECONDS) -> None:
        """After the executor has stopped: hand back what it never finished (jobs queued
        inside it that never started, or cut off by a cold stop), write the last outcomes,
        leave the cluster. Waits for those writes ``timeout`` seconds at most, and not at
        all once the store has refused one (unreachable): what is not written then stays
        RUNNING and comes back through orphan recovery."""
        if self._closed.is_set():
            return
        self.stop_claiming()
        closing = self._clock.monotonic()
        with self._lock:
            # A success whose result waits for the settler is not unfinished.
            unfinished = [c for c in self._in_flight.items() if c not in self._unwritten]
            self._in_flight.clear()
        for job_id, token in unfinished:
            self._report(self._with_permit(Settlement(job_id, token, JobStatus.PENDING)))
        if unfinished:
            logger.info(
                "ratchet: handing back %d jobs the executor did not finish", len(unfinished)
            )
        deadline = self._clock.monotonic() + timeout
        while self._unwritten_count() and self._clock.monotonic() < deadline:
            if self._write_failed_at > closing + 1.0:  # unreachable, not a passing lock
                deadline = self._clock.monotonic() + 0.5
                break
            self._clock.sleep(0.05)
        self._closed.set()
        self._stop_relay.close()
        self._settlements.put(_CLOSED)  # wakes the settler now
        for source in self.wakeups:
            source.stop()
        if self.control is not None:
            self.control.close(timeout=max(0.1, deadline - self._clock.monotonic()))
        for thread in self._threads:
            self._wait_until_ended(thread, max(0.1, deadline - self._clock.monotonic()))
        left = self._unwritten_count()
        if left:
            # The node row stays: its jobs come back through orphan recovery after the grace
            # period, like those of a node that died.
            logger.error(
                "ratchet: %d job outcomes could not be written before shutdown; those jobs "
                "stay RUNNING and return to PENDING through orphan recovery",
                left,
            )
            return
        try:
            self.store.remove_node(self.node_id)
            logger.info("ratchet: node %s left the cluster", self.node_id)
        except Exception as exc:
            logger.warning("ratchet: node row not removed (%s); orphan recovery will", exc)
