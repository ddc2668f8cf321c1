"""The worker's database side: claim, hand over, record outcomes, heartbeat, recover orphans.

Knows nothing of Celery: it is given a ``dispatch`` callable that starts one claimed job and
must eventually be told the outcome through :meth:`WorkerRuntime.settle`.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from celery_ratchet.domain.job import ClaimedJob, JobStatus, Settlement
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.jobstore import JobStore

logger = logging.getLogger(__name__)

_SETTLE_BATCH = 500


@dataclass(frozen=True)
class Capacity:
    """How much work this node takes: ``running`` at once, plus ``buffered`` claimed ahead."""

    running: int
    buffered: int

    @property
    def total(self) -> int:
        return self.running + self.buffered


class _Throttle:
    """Logs a recurring problem once per interval instead of once per attempt."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}

    def warn(self, key: str, msg: str, *args: object) -> None:
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self.interval:
            self._last[key] = now
            logger.warning(msg, *args)

    def clear(self, key: str, msg: str) -> None:
        if self._last.pop(key, None) is not None:
            logger.warning(msg)


class WorkerRuntime:
    def __init__(
        self,
        store: JobStore,
        settings: RatchetSettings,
        *,
        node_id: str,
        queues: Sequence[str],
        capacity: Capacity,
        dispatch: Callable[[ClaimedJob], None],
        hostname: str | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id
        self.queues = list(queues)
        self.capacity = capacity
        self.dispatch = dispatch
        self.hostname = hostname or socket.gethostname()
        self._ready: deque[ClaimedJob] = deque()
        self._in_flight: dict[str, str] = {}  # job id → claim token
        self._lock = threading.Lock()
        self._wake = threading.Event()  # something changed: a slot freed, or a hint
        self._hint = threading.Event()  # new work may be due
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self._settlements: queue.Queue[Settlement] = queue.Queue()
        self._threads: list[threading.Thread] = []
        self._throttle = _Throttle(max(settings.poll_interval, 5.0))

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._register()
        for name, target in (
            ("poller", self._poll_loop),
            ("settler", self._settle_loop),
            ("heartbeat", self._heartbeat_loop),
            ("orphan-scan", self._orphan_loop),
        ):
            self._spawn(name, target)

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"ratchet-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def resume(self) -> None:
        """Claim again after :meth:`stop_claiming` (the executor restarted)."""
        if self._closed.is_set() or not self._stopping.is_set():
            return
        self._stopping.clear()
        self._threads = [t for t in self._threads if t.is_alive()]
        self._spawn("poller", self._poll_loop)
        self._spawn("orphan-scan", self._orphan_loop)

    def _register(self) -> None:
        while not self._stopping.is_set():
            try:
                self.store.register_node(
                    self.node_id, self.hostname, os.getpid(), self.queues, self.capacity.running
                )
                logger.info(
                    "ratchet: node %s consuming %s from %s",
                    self.node_id,
                    ",".join(self.queues),
                    self.store.display_url,
                )
                return
            except StoreUnavailable as exc:
                self._throttle.warn("register", "ratchet: %s; retrying", exc)
                self._stopping.wait(self.settings.poll_interval)

    def stop_claiming(self) -> list[ClaimedJob]:
        """Stop taking work and hand claimed-but-unstarted jobs back at once."""
        self._stopping.set()
        self._wake.set()
        for thread in self._threads:
            if thread.name == "ratchet-poller":
                thread.join(timeout=30)
        with self._lock:
            unstarted = list(self._ready)
            self._ready.clear()
        for job in unstarted:
            self._settlements.put(Settlement(job.job_id, job.token, JobStatus.PENDING))
        if unstarted:
            logger.info("ratchet: handing back %d unstarted jobs", len(unstarted))
        return unstarted

    def close(self, timeout: float = 30.0) -> None:
        """After the executor has stopped: hand back what it never finished (jobs queued
        inside it that never started, or cut off by a cold stop), write the last outcomes,
        leave the cluster."""
        if not self._stopping.is_set():
            self.stop_claiming()
        with self._lock:
            unfinished = list(self._in_flight.items())
            self._in_flight.clear()
        for job_id, token in unfinished:
            self._settlements.put(Settlement(job_id, token, JobStatus.PENDING))
        if unfinished:
            logger.info(
                "ratchet: handing back %d jobs the executor did not finish", len(unfinished)
            )
        self._closed.set()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        if not self._settlements.empty():
            logger.error(
                "ratchet: %d job outcomes could not be written before shutdown; those jobs "
                "stay RUNNING and return to PENDING through orphan recovery",
                self._settlements.qsize(),
            )
            return
        try:
            self.store.remove_node(self.node_id)
            logger.info("ratchet: node %s left the cluster", self.node_id)
        except StoreUnavailable as exc:
            logger.warning("ratchet: node row not removed (%s); orphan recovery will", exc)

    # -- outcomes ---------------------------------------------------------------------------

    def settle(self, settlement: Settlement) -> None:
        """Record the end of one dispatched job (thread-safe, never blocks on the database)."""
        self.release(settlement.job_id, settlement.token)
        self._settlements.put(settlement)

    def release(self, job_id: str, token: str) -> None:
        """Free the slot of a job whose row needs no write (a retry already rescheduled it)."""
        with self._lock:
            if self._in_flight.get(job_id) == token:
                del self._in_flight[job_id]
        self._wake.set()

    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # -- loops ------------------------------------------------------------------------------

    def _dispatch_ready(self) -> None:
        while True:
            with self._lock:
                if not self._ready or len(self._in_flight) >= self.capacity.running:
                    return
                job = self._ready.popleft()
                self._in_flight[job.job_id] = job.token
            try:
                self.dispatch(job)
            except Exception as exc:
                logger.exception("ratchet: could not start job %s", job.job_id)
                self.settle(
                    Settlement(
                        job.job_id,
                        job.token,
                        JobStatus.FAILED,
                        error=f"could not start the job: {exc!r}",
                    )
                )

    def _room(self) -> tuple[int, bool]:
        """How many jobs to claim, and whether it is time to: the local buffer is down to half
        (so claims come in batches, not one per finished job)."""
        with self._lock:
            ready, held = len(self._ready), len(self._ready) + len(self._in_flight)
        room = min(self.capacity.total - held, self.settings.claim_batch_size)
        return room, ready <= self.capacity.buffered // 2

    def _claim(self, room: int) -> list[ClaimedJob]:
        try:
            claimed = self.store.claim(self.node_id, self.queues, room)
        except StoreUnavailable as exc:
            self._throttle.warn("claim", "ratchet: %s; retrying", exc)
            return []
        except Exception:
            logger.exception("ratchet: claim failed")
            return []
        self._throttle.clear("claim", "ratchet: job store reachable again")
        return claimed

    def _poll_loop(self) -> None:
        settings = self.settings
        idle_wait = settings.poll_interval_min
        next_claim = 0.0
        while not self._stopping.is_set():
            self._wake.clear()  # before looking: a change made after this wakes the wait below
            self._dispatch_ready()
            room, low = self._room()
            wants_work = room > 0 and low
            if wants_work and (self._hint.is_set() or time.monotonic() >= next_claim):
                self._hint.clear()
                claimed = self._claim(room)
                if claimed:
                    with self._lock:
                        self._ready.extend(claimed)
                    self._dispatch_ready()
                if len(claimed) == room:  # there may be more due: claim again at once
                    idle_wait, next_claim = settings.poll_interval_min, 0.0
                    continue
                # The queue ran dry: back off, doubling up to the poll interval.
                idle_wait = (
                    settings.poll_interval_min
                    if claimed
                    else min(idle_wait * 2, settings.poll_interval)
                )
                next_claim = time.monotonic() + idle_wait
            # Sleep until a slot frees, a wake-up hint arrives, or the next claim is due.
            timeout = (
                max(0.0, next_claim - time.monotonic()) if wants_work else (settings.poll_interval)
            )
            self._wake.wait(timeout)

    def wake(self) -> None:
        """New work may be due (an enqueue notification, recovered orphans): claim now."""
        self._hint.set()
        self._wake.set()

    def _settle_loop(self) -> None:
        pending: list[Settlement] = []
        while True:
            if not pending:
                try:
                    pending.append(self._settlements.get(timeout=0.2))
                except queue.Empty:
                    if self._closed.is_set():
                        return
                    continue
            while len(pending) < _SETTLE_BATCH:
                try:
                    pending.append(self._settlements.get_nowait())
                except queue.Empty:
                    break
            try:
                self.store.settle(pending)
                pending = []
                self._throttle.clear("settle", "ratchet: job outcomes are being written again")
            except StoreUnavailable as exc:
                self._throttle.warn("settle", "ratchet: %s; will retry, nothing is lost", exc)
                if self._closed.wait(self.settings.poll_interval_min * 10):
                    # Shutting down: keep trying until close() gives up on us.
                    time.sleep(self.settings.poll_interval_min)
            except Exception:
                logger.exception("ratchet: recording %d job outcomes failed", len(pending))
                pending = []

    def _heartbeat_loop(self) -> None:
        interval = self.settings.node_heartbeat_interval_seconds
        while not self._closed.wait(interval):
            try:
                if not self.store.heartbeat(self.node_id):
                    logger.error(
                        "ratchet: node %s was declared dead by the cluster (no heartbeat for "
                        "%ss); its running jobs may run again elsewhere. Re-registering.",
                        self.node_id,
                        self.settings.node_orphan_grace_seconds,
                    )
                    self._register()
                self._throttle.clear("heartbeat", "ratchet: heartbeat written again")
            except StoreUnavailable as exc:
                self._throttle.warn("heartbeat", "ratchet: heartbeat failed: %s", exc)

    def _orphan_loop(self) -> None:
        interval = self.settings.orphan_scan_interval
        while not self._stopping.wait(interval):
            try:
                recovered = self.store.recover_orphans(self.settings.node_orphan_grace_seconds)
            except StoreUnavailable as exc:
                self._throttle.warn("orphans", "ratchet: orphan scan failed: %s", exc)
                continue
            if recovered:
                logger.warning(
                    "ratchet: recovered %d jobs of dead nodes: %s",
                    len(recovered),
                    ", ".join(recovered[:20]),
                )
                self.wake()
