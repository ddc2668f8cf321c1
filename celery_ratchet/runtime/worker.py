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
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import Protocol

from celery_ratchet.domain.breaker import BreakerConfig, BreakerState, CircuitBreaker
from celery_ratchet.domain.control import CONTROL_WAKEUP
from celery_ratchet.domain.job import (
    PROBE_WAKEUP,
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    NewJob,
    Settlement,
)
from celery_ratchet.domain.liveness import LivenessJudge
from celery_ratchet.domain.schedule import MasterSpec, Plan, plan
from celery_ratchet.errors import StoreBusy, StoreUnavailable
from celery_ratchet.runtime.control import CommandRunner, ControlLoop
from celery_ratchet.runtime.fence import Fence, new_tag, stamp
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.jobstore import JobStore

logger = logging.getLogger(__name__)

_SETTLE_BATCH = 500
#: A recurring master due but not claimed (claimed by another node meanwhile, or this node
#: cannot claim now) is looked at again this much later.
_MASTER_CHECK_SECONDS = 0.25
#: Wake this much after a known due time, so the database's clock has passed it too.
_DUE_MARGIN_SECONDS = 0.005
#: While no announcement has reached this node, it asks for one this often.
_PROBE_SECONDS = 30.0
#: Recurring masters claimed, and fired in one transaction, at once.
_MASTER_BATCH = 200
#: A recurring master that cannot be planned is retried this much later, not abandoned.
_MASTER_RETRY_SECONDS = 60.0
#: Put in the settler's queue when the runtime closes: nothing to write, just wake up.
_CLOSED = Settlement("", "", JobStatus.PENDING)
#: How long a stopping worker waits to write its last outcomes while the store answers.
SHUTDOWN_WRITE_SECONDS = 5.0
#: How often a worker looks for batches all of whose children ended but that nobody finished.
HOUSEKEEPING_INTERVAL = 10.0

#: Builds the job of one occurrence of a recurring master, for one fire time.
OccurrenceFactory = Callable[[ClaimedJob, MasterSpec, datetime], NewJob]


class WakeupSource(Protocol):
    """Something that calls ``wake(queue)`` when jobs of that queue were committed, and
    ``wake(REVOCATIONS_WAKEUP)`` when running jobs were asked to stop. While its ``live``
    attribute (if it has one) is false, nothing is announced and the worker polls."""

    def start(self, wake: Callable[[str], None]) -> None: ...

    def stop(self) -> None: ...


#: The circuit breaker a job's task is protected by: (service name, its configuration).
BreakerLookup = Callable[[ClaimedJob], "tuple[str, BreakerConfig] | None"]


@dataclass(frozen=True)
class Capacity:
    """How much work this node takes: ``running`` at once, plus ``buffered`` claimed ahead."""

    running: int
    buffered: int
    #: Jobs that actually execute at once (the pool's processes); 0 means ``running``.
    slots: int = 0
    #: Of the jobs in flight, at most this many single jobs (every kind but batch
    #: children) and this many batch children; 0: no limit by kind.
    single_limit: int = 0
    batch_child_limit: int = 0

    def limit_for(self, job: ClaimedJob) -> int:
        if job.batch_child:
            return self.batch_child_limit
        return self.single_limit

    @property
    def total(self) -> int:
        return self.running + self.buffered

    @property
    def executing(self) -> int:
        return self.slots or self.running


class _Throttle:
    """Logs a recurring problem once per interval instead of once per attempt. The store
    being unreachable is logged by the store itself, once per outage: here only at DEBUG."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}

    def warn(self, key: str, msg: str, *args: object) -> None:
        if any(isinstance(a, StoreUnavailable) for a in args):
            logger.debug(msg, *args)
            return
        now = time.monotonic()
        if now - self._last.get(key, -1e9) >= self.interval:
            self._last[key] = now
            logger.warning(msg, *args)

    def clear(self, key: str, msg: str) -> None:
        if self._last.pop(key, None) is not None:
            logger.warning(msg)

    def forget(self, key: str) -> None:
        """The problem ended; nothing worth saying about it."""
        self._last.pop(key, None)


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
        occurrence: OccurrenceFactory | None = None,
        hostname: str | None = None,
        breaker_for: BreakerLookup | None = None,
        on_revoke: Callable[[str, str], None] | None = None,
        revoked_error: str | None = None,
        wakeups: Sequence[WakeupSource] = (),
        housekeeping: Callable[[], object] | None = None,
        fence: Fence | None = None,
        control: CommandRunner | None = None,
    ) -> None:
        self.store = store
        #: Runs the remote control commands broadcast through the store (``celery inspect``).
        self.control: ControlLoop | None = None
        if control is not None:
            self.control = ControlLoop(
                store,
                control,
                hostname=hostname or socket.gethostname(),
                poll_seconds=self._control_poll,
            )
        #: Called every HOUSEKEEPING_INTERVAL (finishing batches cut short by a dead node).
        self.housekeeping = housekeeping
        self.settings = settings
        self.node_id = node_id
        self.queues = list(queues)
        self.capacity = capacity
        self.dispatch = dispatch
        self.occurrence = occurrence
        #: Recurring masters (monotonic times): claim when the earliest is due; read when
        #: that is again (a master created or changed elsewhere, without a wake-up).
        self._master_due = 0.0
        self._master_look = 0.0
        self._masters_changed = threading.Event()  # told: read their due time again
        self.hostname = hostname or socket.gethostname()
        self._ready: deque[ClaimedJob] = deque()
        self._in_flight: dict[str, str] = {}  # job id → claim token
        #: With limits by kind: whether each job in flight is a batch child, and how many
        #: of each kind (False: single, True: batch child) are in flight.
        self._kinds: dict[str, bool] = {}
        self._kind_counts = {False: 0, True: 0}
        #: Permits and breakers of jobs in flight, by (job id, claim token).
        self._permits: dict[tuple[str, str], str] = {}
        #: (breaker, whether this execution is its half-open probe)
        self._protected: dict[tuple[str, str], tuple[CircuitBreaker, bool]] = {}
        self.breaker_for = breaker_for if settings.circuit_breaker else None
        self.breakers: dict[str, CircuitBreaker] = {}
        #: Called with (job id, ``REVOKE`` or a signal name) for a started job to stop.
        self.on_revoke = on_revoke
        self.revoked_error = revoked_error
        self.wakeups = list(wakeups)
        self._revoke_hint = threading.Event()  # a running job may have been asked to stop
        #: An announcement reached this node: the channel delivers (a LISTEN behind a
        #: transaction-pooling PgBouncer subscribes, yet hears nothing).
        self._heard = threading.Event()
        self._next_probe = 0.0
        self._lock = threading.Lock()
        self._wake = threading.Event()  # something changed: a slot freed, or a hint
        self._hint = threading.Event()  # new work may be due
        self._stopping = threading.Event()
        self._closed = threading.Event()
        self._settlements: queue.Queue[Settlement] = queue.Queue()
        #: Outcomes reported but not yet written: queued or in the settler's hands.
        self._unwritten: dict[tuple[str, str], Settlement] = {}
        self._threads: list[threading.Thread] = []
        self._throttle = _Throttle(max(settings.poll_interval, 5.0))
        #: When the last heartbeat that went through was sent (monotonic).
        self._last_heartbeat = time.monotonic()
        #: When a write of outcomes last failed (the store unreachable or busy).
        self._write_failed_at = 0.0
        #: Where the executing processes read whether this node's claims are still its own.
        self.fence = fence
        self._fence_tag = new_tag()
        #: This node's registration: one more each time it registers (after being declared
        #: dead, its earlier claims are not its own any more).
        self._epoch = 0
        #: When this node first registered, by the database clock.
        self._registered_at: datetime | None = None
        #: Which other nodes are dead, from heartbeats this node saw not advance.
        self._judge: LivenessJudge[datetime] = LivenessJudge(
            settings.node_orphan_grace_seconds, node_id
        )
        self._judge_lock = threading.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._register()
        if self._stopping.is_set():  # told to stop before it could register: claim nothing
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
            self.control.start(since=self._registered_at)
        for source in self.wakeups:
            source.start(self._woken)

    def _control_poll(self) -> float:
        """Longest wait between two looks for control commands: while broadcasts are
        announced, only the safety net for a lost notification."""
        if self._told():
            return self.settings.wakeup_poll_interval
        return self.settings.control_poll_interval

    def _subscribed(self) -> bool:
        return any(getattr(source, "live", True) for source in self.wakeups)

    def _told(self) -> bool:
        """Whether changes are announced to this node now: a wake-up channel is subscribed
        and has delivered (the node's own probe, or any announcement)."""
        return self._heard.is_set() and self._subscribed()

    def _probe(self) -> None:
        """Subscribed but never told anything yet: send a probe on every channel (on
        PostgreSQL from the store's connection, not the listening one), now and then."""
        now = time.monotonic()
        if self._heard.is_set() or now < self._next_probe or not self._subscribed():
            return
        self._next_probe = now + _PROBE_SECONDS
        try:
            self.store.announce(PROBE_WAKEUP)
        except Exception as exc:
            self._throttle.warn("announce", "ratchet: wake-up not sent: %s", exc)
        self._announce([PROBE_WAKEUP])

    @property
    def _idle_look(self) -> float:
        """Longest idle wait between two looks at the store: while changes are announced,
        only the safety net for a lost notification."""
        if self._told():
            return self.settings.wakeup_poll_interval
        return self.settings.poll_interval

    def _woken(self, queue: str) -> None:
        """A job of ``queue`` was committed (claim now if it is one of ours), a recurring
        master changed, or running jobs were asked to stop."""
        self._heard.set()
        if queue == REVOCATIONS_WAKEUP:
            self._revoke_hint.set()
        elif queue == CONTROL_WAKEUP:
            if self.control is not None:
                self.control.hint()
        elif queue == SCHEDULES_QUEUE:
            if self.occurrence is not None:
                self._masters_changed.set()
                self._wake.set()
        elif queue in self.queues:
            self.wake()

    def _spawn(self, name: str, target: Callable[[], None]) -> None:
        thread = threading.Thread(target=target, name=f"ratchet-{name}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def resume(self) -> None:
        """Claim again after :meth:`stop_claiming` (the executor restarted)."""
        if self._closed.is_set() or not self._stopping.is_set():
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        running = {t.name for t in self._threads}
        if {"ratchet-poller", "ratchet-orphan-scan"} & running:
            logger.warning("ratchet: previous claim loop still stopping; not resuming yet")
            return
        self._stopping.clear()
        self._spawn("poller", self._poll_loop)
        self._spawn("orphan-scan", self._orphan_loop)

    def _register(self) -> None:
        while not self._stopping.is_set():
            sent = time.monotonic()
            try:
                registered = self.store.register_node(
                    self.node_id, self.hostname, os.getpid(), self.queues, self.capacity.executing
                )
                if self._registered_at is None:
                    self._registered_at = registered
                with self._lock:
                    self._epoch += 1
                self._confirmed(sent)
                logger.info(
                    "ratchet: node %s consuming %s from %s",
                    self.node_id,
                    ",".join(self.queues),
                    self.store.display_url,
                )
                return
            except Exception as exc:
                self._lost_contact()
                self._throttle.warn("register", "ratchet: node not registered: %s; retrying", exc)
                self._stopping.wait(self.settings.poll_interval)

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
        """Start no more jobs, from now on (safe in a signal handler: it only sets flags);
        :meth:`stop_claiming` then waits for the claim loop and hands the buffer back."""
        self._stopping.set()
        self._wake.set()

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
        closing = time.monotonic()
        with self._lock:
            unfinished = list(self._in_flight.items())
            self._in_flight.clear()
        for job_id, token in unfinished:
            self._report(self._with_permit(Settlement(job_id, token, JobStatus.PENDING)))
        if unfinished:
            logger.info(
                "ratchet: handing back %d jobs the executor did not finish", len(unfinished)
            )
        deadline = time.monotonic() + timeout
        while self._unwritten_count() and time.monotonic() < deadline:
            if self._write_failed_at > closing + 1.0:  # unreachable, not a passing lock
                deadline = time.monotonic() + 0.5
                break
            time.sleep(0.05)
        self._closed.set()
        self._settlements.put(_CLOSED)  # wakes the settler now
        for source in self.wakeups:
            source.stop()
        if self.control is not None:
            self.control.close(timeout=max(0.1, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(timeout=max(0.1, deadline - time.monotonic()))
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

    # -- outcomes ---------------------------------------------------------------------------

    def settle(self, settlement: Settlement) -> None:
        """Record the end of one dispatched job (thread-safe, never blocks on the database)."""
        settlement = self._with_permit(settlement)
        # Reported before it is freed: at every instant the job is in flight or unwritten,
        # so the claim check (_reconcile) never takes it for a claim this node lost.
        self._report(settlement)
        self._free(settlement.job_id, settlement.token)

    def _with_permit(self, settlement: Settlement) -> Settlement:
        with self._lock:
            resource = self._permits.pop((settlement.job_id, settlement.token), None)
        return settlement if resource is None else replace(settlement, resource=resource)

    def record_outcome(self, job_id: str, token: str, failed: bool) -> None:
        """Count a finished execution in its task's circuit breaker, if it has one."""
        with self._lock:
            protected = self._protected.pop((job_id, token), None)
            if protected is not None:
                breaker, probe = protected
                breaker.record(failed, time.monotonic(), probe=probe)

    def _report(self, settlement: Settlement) -> None:
        with self._lock:
            self._unwritten[(settlement.job_id, settlement.token)] = settlement
        self._settlements.put(settlement)

    def _written(self, settlements: list[Settlement]) -> None:
        with self._lock:
            for s in settlements:
                self._unwritten.pop((s.job_id, s.token), None)
        if any(s.status is JobStatus.PENDING for s in settlements):
            # Handed back, due again at once: this node may claim them (claims it had lost
            # track of), others are told where the channel does not tell them by itself.
            self._announce(self.queues)
            self.wake()

    def _announce(self, words: Sequence[str]) -> None:
        for source in self.wakeups:
            announce = getattr(source, "announce", None)
            if announce is not None:
                try:
                    announce(words)
                except Exception as exc:  # a wake-up only makes a claim happen sooner
                    self._throttle.warn("announce", "ratchet: wake-up not sent: %s", exc)

    def _unwritten_count(self) -> int:
        with self._lock:
            return len(self._unwritten)

    def release(self, job_id: str, token: str) -> None:
        """Free the slot of a job whose row needs no write (a retry already rescheduled it):
        the row may be due again, so claim at once rather than at the next idle look."""
        self._free(job_id, token)
        self._hint.set()

    def _free(self, job_id: str, token: str) -> None:
        with self._lock:
            if self._in_flight.get(job_id) == token:
                del self._in_flight[job_id]
                self._uncount_kind(job_id)
            self._permits.pop((job_id, token), None)
            self._protected.pop((job_id, token), None)  # an end with no outcome to count
        self._wake.set()

    # -- loops ------------------------------------------------------------------------------

    def _confirmed(self, sent: float) -> None:
        """A heartbeat (or the registration) sent at ``sent`` went through: no node can
        declare this one dead before ``sent`` plus a grace period, as they judge it."""
        self._last_heartbeat = sent
        if self.fence is not None:
            settings = self.settings
            margin = settings.node_orphan_grace_seconds - settings.node_heartbeat_interval_seconds
            with self._lock:
                epoch = self._epoch
            self.fence.publish(self._fence_tag, epoch, sent + margin)

    def _lost_contact(self) -> None:
        with self._judge_lock:
            self._judge.lost_contact()

    def _stamped(self, claimed: list[ClaimedJob], epoch: int) -> list[ClaimedJob]:
        if self.fence is None:
            return claimed
        fence = stamp(self._fence_tag, epoch)
        return [replace(job, fence=fence) for job in claimed]

    def _heartbeat_stale(self) -> bool:
        """No heartbeat written for so long that the cluster may have declared us dead and
        handed our claims to others: starting a claimed job now could run it twice."""
        limit = (
            self.settings.node_orphan_grace_seconds - self.settings.node_heartbeat_interval_seconds
        )
        return time.monotonic() - self._last_heartbeat > limit

    def _drop_buffer(self, why: str) -> None:
        with self._lock:
            dropped = len(self._ready)
            self._ready.clear()
        if dropped:
            logger.error("ratchet: dropped %d claimed, unstarted jobs: %s", dropped, why)

    def _dispatch_ready(self) -> None:
        if self._heartbeat_stale():
            self._drop_buffer("no heartbeat for too long, the claims may belong to others now")
            return
        deferred: list[tuple[ClaimedJob, datetime]] = []
        try:
            self._dispatch_until_full(deferred)
        finally:
            if deferred:
                self._defer(deferred)

    def _dispatch_until_full(self, deferred: list[tuple[ClaimedJob, datetime]]) -> None:
        while True:
            with self._lock:
                if self._stopping.is_set():  # stopping: the buffer is handed back instead
                    return
                if not self._ready or len(self._in_flight) >= self.capacity.running:
                    return
                job = self._next_startable()
                if job is None:  # every kind with jobs waiting is at its limit
                    return
                # In flight from the moment it leaves the buffer: the claim check
                # (_reconcile) must never see a job that is about to start as a lost claim.
                self._in_flight[job.job_id] = job.token
                self._count_kind(job)
            until = self._breaker_hold(job)
            if until is not None:
                with self._lock:
                    if self._in_flight.get(job.job_id) == job.token:
                        del self._in_flight[job.job_id]
                        self._uncount_kind(job.job_id)
                deferred.append((job, until))
                continue
            with self._lock:
                if job.resource is not None:
                    self._permits[(job.job_id, job.token)] = job.resource
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

    def _next_startable(self) -> ClaimedJob | None:
        """The first buffered job whose kind is under its limit, taken from the buffer
        (under the lock)."""
        capacity = self.capacity
        if not (capacity.single_limit or capacity.batch_child_limit):
            return self._ready.popleft()
        for index, job in enumerate(self._ready):
            child = job.batch_child
            limit = capacity.limit_for(job)
            if not limit or self._kind_counts[child] < limit:
                del self._ready[index]
                return job
        return None

    def _count_kind(self, job: ClaimedJob) -> None:
        if self.capacity.single_limit or self.capacity.batch_child_limit:
            child = job.batch_child
            self._kinds[job.job_id] = child
            self._kind_counts[child] += 1

    def _uncount_kind(self, job_id: str) -> None:
        child = self._kinds.pop(job_id, None)
        if child is not None:
            self._kind_counts[child] -= 1

    def _breaker_hold(self, job: ClaimedJob) -> datetime | None:
        """When the job's circuit breaker is open: the time to try it again."""
        if self.breaker_for is None:
            return None
        try:
            found = self.breaker_for(job)
        except Exception as exc:  # a bad breaker setting must not stop the claim loop
            self._throttle.warn(
                f"breaker:{job.task_name}",
                "ratchet: no circuit breaker for %s: %s",
                job.task_name,
                exc,
            )
            return None
        if found is None:
            return None
        service, config = found
        now = time.monotonic()
        with self._lock:
            breaker = self.breakers.get(service)
            if breaker is None:
                breaker = self.breakers[service] = CircuitBreaker(config)
            until = breaker.defer_until(now)
            if until is None:
                probe = breaker.state is BreakerState.HALF_OPEN
                self._protected[(job.job_id, job.token)] = (breaker, probe)
                return None
        claimed_at = job.claimed_now or datetime.now(timezone.utc)
        return claimed_at + timedelta(seconds=until - now)

    def _defer(self, deferred: list[tuple[ClaimedJob, datetime]]) -> None:
        """Put jobs whose service's breaker is open back, due when it half-opens; they
        lose no attempt."""
        try:
            self.store.defer([(job.job_id, job.token, due) for job, due in deferred])
        except Exception as exc:  # kept claimed and buffered: deferred again next round
            self._throttle.warn("defer", "ratchet: jobs not deferred yet: %s", exc)
            with self._lock:
                self._ready.extend(job for job, _ in deferred)
            return
        logger.info(
            "ratchet: circuit open; deferred %d jobs (%s)",
            len(deferred),
            ", ".join(sorted({job.task_name for job, _ in deferred})),
        )

    def _room(self) -> tuple[int, bool]:
        """How many jobs to claim, and whether it is time to: the local buffer is down to half
        (so claims come in batches, not one per finished job)."""
        with self._lock:
            ready, held = len(self._ready), len(self._ready) + len(self._in_flight)
        room = min(self.capacity.total - held, self.settings.claim_batch_size)
        return room, ready <= self.capacity.buffered // 2

    def _claim(self, room: int) -> list[ClaimedJob]:
        # Jobs that need a permit first: few at a time, and never starved by the rest. A node
        # holds no more of them than it can execute at once, so a permit is never held by a
        # job queued behind others while another node sits idle.
        claimed: list[ClaimedJob] = []
        with self._lock:
            held = len(self._permits) + sum(1 for j in self._ready if j.resource is not None)
        permit_room = max(0, self.capacity.executing - held)
        for resource, capacity in self.settings.resources.items():
            if min(room, permit_room) > len(claimed):
                claimed += self._claim_with(
                    self.store.claim_for_resource,
                    self.node_id,
                    self.queues,
                    resource,
                    capacity,
                    min(room, permit_room) - len(claimed),
                )
        if room > len(claimed):
            claimed += self._claim_with(
                self.store.claim, self.node_id, self.queues, room - len(claimed)
            )
        return claimed

    def _claim_with(
        self, claim: Callable[..., list[ClaimedJob]], *args: object
    ) -> list[ClaimedJob]:
        try:
            claimed = claim(*args)
        except StoreUnavailable as exc:
            self._throttle.warn("claim", "ratchet: %s; retrying", exc)
            return []
        except StoreBusy as exc:
            # Lock conflicts (certification conflicts on Galera): the store was reachable
            # all along, so their end is no "reachable again".
            self._throttle.warn("claim-busy", "ratchet: claim deferred: %s; retrying", exc)
            return []
        except Exception:
            logger.exception("ratchet: claim failed")
            return []
        self._throttle.clear("claim", "ratchet: job store reachable again")
        self._throttle.forget("claim-busy")
        return claimed

    def _poll_loop(self) -> None:
        settings = self.settings
        idle_wait = settings.poll_interval_min
        next_claim = 0.0
        while not self._stopping.is_set():
            try:
                self._wake.clear()  # before looking: a change made after this wakes the wait below
                self._probe()
                self._fire_due_masters()
                self._dispatch_ready()
                room, low = self._room()
                wants_work = room > 0 and low and not self._heartbeat_stale()
                if wants_work and (self._hint.is_set() or time.monotonic() >= next_claim):
                    self._hint.clear()
                    with self._lock:
                        epoch = self._epoch
                    claimed = self._claim(room)
                    revoked = self._drop_revoked(claimed)
                    if revoked:
                        claimed = [j for j in claimed if j not in revoked]
                    if claimed:
                        self._take(claimed, epoch)
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
                    if not claimed and self._told():
                        next_claim = self._next_claim_when_told(next_claim)
                # Sleep until a slot frees, a wake-up hint arrives, or the next claim is due.
                timeout = (
                    max(0.0, next_claim - time.monotonic())
                    if wants_work
                    else (settings.poll_interval)
                )
                if self.occurrence is not None:
                    masters_at = min(self._master_due, self._master_look)
                    if self._masters_changed.is_set():
                        masters_at = 0.0
                    timeout = min(timeout, max(0.0, masters_at - time.monotonic()))
                self._wake.wait(timeout)
            except Exception:  # keep claiming: a dead poller would strand this node
                logger.exception("ratchet: claim loop error; continuing")
                self._stopping.wait(settings.poll_interval)

    def _take(self, claimed: list[ClaimedJob], epoch: int) -> None:
        """Buffer jobs just claimed, unless this node was declared dead (and registered
        again) meanwhile: then the claims are handed back, never started."""
        stamped = self._stamped(claimed, epoch)
        with self._lock:
            current = epoch == self._epoch
            if current:
                self._ready.extend(stamped)
        if not current:
            for job in claimed:
                self._report(
                    Settlement(job.job_id, job.token, JobStatus.PENDING, resource=job.resource)
                )
            logger.warning(
                "ratchet: handing back %d jobs claimed before this node was declared dead",
                len(claimed),
            )

    def _next_claim_when_told(self, backoff: int | float) -> float:
        """With a wake-up channel, an empty claim need not be repeated every poll interval:
        new jobs are announced. Sleep until the earliest pending job of our queues is due
        (a countdown, a retry, a deferred job), at most the safety interval; a job due but
        not claimed (its permits taken) is tried again after the usual backoff."""
        try:
            due_in = self.store.next_due_in(self.queues)
        except Exception as exc:
            self._throttle.warn("due", "ratchet: next due time not read: %s", exc)
            return float(backoff)
        now = time.monotonic()
        if due_in is None:
            return now + self._idle_look
        if due_in <= 0:
            return float(backoff)
        return now + min(due_in + _DUE_MARGIN_SECONDS, self._idle_look)

    def _fire_due_masters(self) -> None:
        """Recurring masters take no slot: they are claimed on their own, whatever the load,
        so a busy node never makes a tick late (and a late tick a misfire). Their next due
        time is known in advance: the node claims when the earliest one is due, and reads
        that time again after each claim, when told a master changed, and otherwise every
        poll interval (with a wake-up channel: every ``wakeup_poll_interval``)."""
        if self.occurrence is None:
            return
        now = time.monotonic()
        due = now >= self._master_due
        look = now >= self._master_look or self._masters_changed.is_set()
        if not (due or look):
            return
        if self._heartbeat_stale():  # claim and read again shortly, without a spin meanwhile
            self._masters_changed.clear()
            self._master_due = self._master_look = now + _MASTER_CHECK_SECONDS
            return
        fired = False
        if due:
            try:
                masters = self.store.claim(self.node_id, [SCHEDULES_QUEUE], _MASTER_BATCH)
            except Exception as exc:
                self._throttle.warn("masters", "ratchet: recurring jobs not checked: %s", exc)
                self._master_due = now + self.settings.poll_interval
                return
            self._fire(masters)
            if len(masters) == _MASTER_BATCH:  # there may be more due: claim again at once
                self._master_due = 0.0
                return
            fired = bool(masters)
        self._read_master_due(claimed_none=due and not fired)

    def _read_master_due(self, *, claimed_none: bool) -> None:
        # Cleared before reading: a change announced meanwhile is read again next round.
        self._masters_changed.clear()
        try:
            due_in = self.store.next_due_in([SCHEDULES_QUEUE])
        except Exception as exc:
            self._throttle.warn("masters", "ratchet: recurring jobs not checked: %s", exc)
            due_in = self.settings.poll_interval
        now = time.monotonic()
        self._master_look = now + self._idle_look
        if due_in is None:
            self._master_due = float("inf")
        elif due_in > 0:
            self._master_due = now + due_in + _DUE_MARGIN_SECONDS
        else:
            # Due already: claim it now; if a claim just found nothing (another node holds
            # it, or it is not claimable yet), look again a little later, not in a spin.
            self._master_due = now + (_MASTER_CHECK_SECONDS if claimed_none else 0.0)

    def _fire(self, masters: Sequence[ClaimedJob]) -> None:
        """Recurring masters came due: create their occurrences, per each one's misfire
        policy, and set their next due times, all in one transaction."""
        assert self.occurrence is not None
        firings: list[tuple[ClaimedJob, list[NewJob], datetime | None]] = []
        plans: list[tuple[MasterSpec, Plan] | None] = []
        for master in masters:
            # The database clock decides what is overdue, as it decided what was due.
            now = max(master.claimed_now or datetime.now(timezone.utc), master.scheduled_time)
            try:
                spec = MasterSpec.from_json(master.schedule_spec or "")
                decided = plan(spec.timetable, master.scheduled_time, now, spec.policy)
                occurrences = [self.occurrence(master, spec, fire) for fire in decided.fire]
            except Exception:
                # Perhaps only this node cannot (a missing time zone, an older version): try
                # again later, on whichever node claims it, rather than abandon the schedule.
                logger.exception(
                    "ratchet: recurring job %s cannot fire; retrying in %ss",
                    master.job_id,
                    _MASTER_RETRY_SECONDS,
                )
                retry_at = now + timedelta(seconds=_MASTER_RETRY_SECONDS)
                firings.append((master, [], retry_at))
                plans.append(None)
                continue
            firings.append((master, occurrences, decided.next_due))
            plans.append((spec, decided))
        if not firings:
            return
        fired: list[bool | None]
        try:
            fired = list(self.store.fire_masters(firings))
        except (StoreUnavailable, StoreBusy) as exc:  # left RUNNING: reconciliation returns them
            self._throttle.warn(
                "fire", "ratchet: %d recurring jobs did not fire: %s", len(firings), exc
            )
            return
        except Exception:
            # One master's occurrences refused (say, a field too long) must not hold the
            # others back: each on its own, and only that one stays unfired.
            fired = [self._fire_alone(*firing) for firing in firings]
        created = False
        for (master, occurrences, _), planned, ok in zip(firings, plans, fired, strict=True):
            if ok is None:  # said already
                continue
            if not ok:
                logger.warning(
                    "ratchet: recurring job %s lost its claim while firing", master.job_id
                )
                continue
            created = created or bool(occurrences)
            if planned is None:
                continue
            spec, decided = planned
            if decided.skipped:
                logger.warning(
                    "ratchet: recurring job %s missed %d fire times; policy %s created %d",
                    master.job_id,
                    decided.skipped + len(decided.fire),
                    spec.misfire,
                    len(decided.fire),
                )
        if created:
            self._hint.set()

    def _fire_alone(
        self, master: ClaimedJob, occurrences: Sequence[NewJob], next_due: datetime | None
    ) -> bool | None:
        """Fire one master; None when it failed (and that was logged)."""
        try:
            return self.store.fire_master(master, occurrences, next_due)
        except Exception as exc:  # left RUNNING: the next reconciliation hands it back
            self._throttle.warn(
                "fire", "ratchet: recurring job %s did not fire: %s", master.job_id, exc
            )
            return None

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
            pending = [s for s in pending if s is not _CLOSED]
            if not pending:
                continue
            if self._write(pending):
                self._written(pending)
                pending = []
                continue
            self._write_failed_at = time.monotonic()
            if self._closed.wait(self.settings.poll_interval_min * 10):
                time.sleep(self.settings.poll_interval_min)  # closing: keep trying

    def _write(self, settlements: list[Settlement]) -> bool:
        """Write outcomes; False (keep them, retry later) while the store is unreachable or
        busy. A batch the database refuses is written row by row, so one bad row (say, a
        traceback it cannot store) does not take the others down with it."""
        try:
            self.store.settle(settlements)
        except (StoreUnavailable, StoreBusy) as exc:
            self._throttle.warn("settle", "ratchet: %s; will retry, nothing is lost", exc)
            return False
        except Exception as exc:
            logger.warning(
                "ratchet: writing %d outcomes failed (%r); one at a time", len(settlements), exc
            )
            return all(self._write_one(s) for s in settlements)
        self._throttle.clear("settle", "ratchet: job outcomes are being written again")
        return True

    def _write_one(self, settlement: Settlement) -> bool:
        try:
            self.store.settle([settlement])
            return True
        except (StoreUnavailable, StoreBusy):
            return False
        except Exception:
            logger.exception(
                "ratchet: outcome of job %s refused; writing its status alone", settlement.job_id
            )
        try:
            self.store.settle([replace(settlement, error=None, traceback=None)])
        except (StoreUnavailable, StoreBusy):
            return False
        except Exception:
            logger.exception(
                "ratchet: outcome of job %s cannot be written; the job stays "
                "RUNNING until this node's claims are reconciled",
                settlement.job_id,
            )
        return True

    def _heartbeat_loop(self) -> None:
        interval = self.settings.node_heartbeat_interval_seconds
        while not self._closed.wait(interval):
            sent = time.monotonic()
            try:
                alive = self.store.heartbeat(self.node_id)
            except Exception as exc:
                self._lost_contact()
                self._throttle.warn("heartbeat", "ratchet: heartbeat failed: %s", exc)
                continue
            if alive:
                self._confirmed(sent)
                self._throttle.clear("heartbeat", "ratchet: heartbeat written again")
                self._watch_others()
            else:
                self._declared_dead()
            self._reconcile()

    def _declared_dead(self) -> None:
        """The cluster declared this node dead and gave its jobs to others: nothing it holds
        may start any more (the buffer is dropped, the executing processes check each claim
        before starting one), and it registers again."""
        if self.fence is not None:
            self.fence.publish(self._fence_tag, -1, 0.0)
        logger.error(
            "ratchet: node %s was declared dead by the cluster (no heartbeat seen for %ss); "
            "its jobs may run again elsewhere. Dropping what it holds, registering again.",
            self.node_id,
            self.settings.node_orphan_grace_seconds,
        )
        self._drop_buffer("this node was declared dead; its claims went to others")
        self._register()

    def _watch_others(self) -> None:
        """Read every node's heartbeat: the orphan scan declares dead only nodes whose
        heartbeat this node saw stand still for a full grace period."""
        try:
            heartbeats = self.store.node_heartbeats()
        except Exception as exc:
            self._lost_contact()
            self._throttle.warn("heartbeat", "ratchet: heartbeats not read: %s", exc)
            return
        with self._judge_lock:
            self._judge.observe(heartbeats, time.monotonic())

    def _reconcile(self) -> None:
        """Hand back rows this node holds RUNNING but no longer knows about (a claim whose
        reply was lost, an outcome that could not be written): a live node's claims are
        never recovered by the orphan scan, so they would stay RUNNING forever."""
        age = 2 * self.settings.node_heartbeat_interval_seconds
        try:
            held = self.store.running_claims(self.node_id, older_than_seconds=age)
        except Exception as exc:
            self._throttle.warn("reconcile", "ratchet: claim check failed: %s", exc)
            return
        with self._lock:
            known = set(self._in_flight.items())
            known |= {(j.job_id, j.token) for j in self._ready}
            known |= set(self._unwritten)
        strays = [claim for claim in held if claim not in known]
        for job_id, token in strays:
            self._report(Settlement(job_id, token, JobStatus.PENDING))
        if strays:
            logger.warning(
                "ratchet: handing back %d claims this node had lost track of: %s",
                len(strays),
                ", ".join(j for j, _ in strays[:20]),
            )

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
        deadline = time.monotonic() + self._idle_look
        while not self._closed.is_set():
            if self._revoke_hint.wait(max(0.0, min(deadline - time.monotonic(), 0.2))):
                self._revoke_hint.clear()
                return True
            if time.monotonic() >= deadline:
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

    def _housekeeping_loop(self) -> None:
        if self.housekeeping is None:
            return
        while not self._stopping.wait(HOUSEKEEPING_INTERVAL):
            try:
                self.housekeeping()
            except Exception as exc:
                self._throttle.warn("housekeeping", "ratchet: housekeeping failed: %s", exc)

    def _orphan_loop(self) -> None:
        """Take the jobs of dead nodes back. A node that was itself cut off from the
        database (or has just started) judges nobody until it has watched the others'
        heartbeats for a full grace period; a node is dead only if its heartbeat did not
        advance all that time."""
        settings = self.settings
        while not self._stopping.wait(settings.orphan_scan_interval):
            now = time.monotonic()
            with self._judge_lock:
                may_judge = self._judge.may_judge(now)
                silent = self._judge.silent(now)
            if not may_judge or self._heartbeat_stale():
                continue
            try:
                recovered = self.store.recover_orphans(
                    settings.node_orphan_grace_seconds,
                    observed=silent,
                    max_recoveries=settings.max_recoveries,
                )
            except Exception as exc:
                self._lost_contact()
                self._throttle.warn("orphans", "ratchet: orphan scan failed: %s", exc)
                continue
            if recovered.dead_nodes:
                logger.warning(
                    "ratchet: declared dead (heartbeat unchanged for %ss): %s",
                    settings.node_orphan_grace_seconds,
                    ", ".join(recovered.dead_nodes),
                )
            if recovered.dead_lettered:
                logger.error(
                    "ratchet: %d jobs of dead nodes moved to the dead-letter queue, their "
                    "nodes having died under them more than ratchet_max_recoveries = %d "
                    "times: %s",
                    len(recovered.dead_lettered),
                    settings.max_recoveries,
                    ", ".join(recovered.dead_lettered[:20]),
                )
            if recovered.requeued:
                logger.warning(
                    "ratchet: recovered %d jobs of dead nodes: %s",
                    len(recovered.requeued),
                    ", ".join(recovered.requeued[:20]),
                )
                self.wake()
