"""A node's runtime, the state its parts share: the store, the settings, the claimed jobs
buffered and in flight, the locks, the wake-up channel and the threads."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from celery_ratchet.domain.breaker import BreakerConfig, CircuitBreaker
from celery_ratchet.domain.control import CONTROL_WAKEUP
from celery_ratchet.domain.job import (
    PROBE_WAKEUP,
    RESUBSCRIBED_WAKEUP,
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    NewJob,
    Settlement,
)
from celery_ratchet.domain.liveness import LivenessJudge
from celery_ratchet.domain.schedule import MasterSpec
from celery_ratchet.errors import StoreUnavailable
from celery_ratchet.runtime.clock import SYSTEM_CLOCK, Clock
from celery_ratchet.runtime.control import CommandRunner, ControlLoop
from celery_ratchet.runtime.fence import Fence, new_tag, stamp
from celery_ratchet.runtime.node_clock import NodeClock
from celery_ratchet.runtime.signal_relay import SignalRelay
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.control import control_store
from celery_ratchet.store.ports import WorkerStore
from celery_ratchet.threads import background_thread

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


class Declined(Exception):
    """Raised by a node's ``dispatch`` for a job it will not start here (its task unknown
    to this worker): the job goes back to the store, due ``after_seconds`` from its claim,
    with no attempt counted."""

    def __init__(self, after_seconds: float) -> None:
        super().__init__(f"handed back for {after_seconds}s")
        self.after_seconds = after_seconds


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

    def __init__(self, interval: float, clock: Clock) -> None:
        self.interval = interval
        self._clock = clock
        self._last: dict[str, float] = {}

    def warn(self, key: str, msg: str, *args: object) -> None:
        if any(isinstance(a, StoreUnavailable) for a in args):
            logger.debug(msg, *args)
            return
        now = self._clock.monotonic()
        if now - self._last.get(key, -1e9) >= self.interval:
            self._last[key] = now
            logger.warning(msg, *args)

    def clear(self, key: str, msg: str) -> None:
        if self._last.pop(key, None) is not None:
            logger.warning(msg)

    def forget(self, key: str) -> None:
        """The problem ended; nothing worth saying about it."""
        self._last.pop(key, None)


class RuntimeBase:
    """What every part of a node's runtime shares: its store, settings, locks, buffers,
    wake-up channel and threads."""

    def __init__(
        self,
        store: WorkerStore,
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
        schedule_keys: Sequence[str] = (),
        clock: NodeClock | None = None,
        local_clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        #: What this node's parts read the time from (a test gives one it drives).
        self._clock = local_clock
        #: This node's clock against the database's, measured again with the heartbeats.
        self.clock = clock
        #: The schedules this node's configuration owns (beat_schedule's entries), said in
        #: its node row: none of them is removed while the node lives.
        self.schedule_keys = list(schedule_keys)
        #: Runs the remote control commands broadcast through the store (``celery inspect``).
        self.control: ControlLoop | None = None
        if control is not None:
            self.control = ControlLoop(
                control_store(store),
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
        #: Whether the last claim found no more due jobs than it had room for, and no new
        #: work was announced since (see Claiming.accepts_chain_step).
        self._ran_dry = False
        #: The process that claims: a forked pool process holds a copy of this object.
        self._pid = os.getpid()
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
        #: What a stop signal's handler sets, set from a thread of its own.
        self._stop_relay = SignalRelay(self._stopping, self._wake, name="ratchet-stop-relay")
        self._settlements: queue.Queue[Settlement] = queue.Queue()
        #: Outcomes reported but not yet written: queued or in the settler's hands.
        self._unwritten: dict[tuple[str, str], Settlement] = {}
        #: Executions that ended with a result not written yet: their slots are freed when
        #: it is (see ``Outcomes.report_result``).
        self._free_when_written: set[tuple[str, str]] = set()
        #: Notified whenever outcomes were written.
        self._outcomes_written = threading.Condition(self._lock)
        self._threads: list[threading.Thread] = []
        #: Set when each of those threads returned (read without a lock: see _wait_until_ended).
        self._ended: dict[threading.Thread, threading.Event] = {}
        self._throttle = _Throttle(max(settings.poll_interval, 5.0), local_clock)
        #: When the last heartbeat that went through was sent (monotonic).
        self._last_heartbeat = self._clock.monotonic()
        #: Whether this node's heartbeat was found stale, and said so (see _heartbeat_stale).
        self._stale = False
        self._stale_lock = threading.Lock()
        #: When a write of outcomes last failed (the store unreachable or busy).
        self._write_failed_at = 0.0
        #: Where the executing processes read whether this node's claims are still its own.
        self.fence = fence
        self._fence_tag = new_tag()
        #: This node's registration: one more each time it registers (after being declared
        #: dead, its earlier claims are not its own any more).
        self._epoch = 0
        #: Which other nodes are dead, from heartbeats this node saw not advance.
        self._judge: LivenessJudge[datetime] = LivenessJudge(
            settings.node_orphan_grace_seconds, node_id
        )
        self._judge_lock = threading.Lock()

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
        now = self._clock.monotonic()
        if self._heard.is_set() or now < self._next_probe or not self._subscribed():
            return
        self._next_probe = now + _PROBE_SECONDS
        try:
            self.store.announce(PROBE_WAKEUP)
        except Exception as exc:
            self._throttle.warn("announce", "ratchet: wake-up not sent: %s", exc)
        self._announce([PROBE_WAKEUP])

    def _announce(self, words: Sequence[str]) -> None:
        for source in self.wakeups:
            announce = getattr(source, "announce", None)
            if announce is not None:
                try:
                    announce(words)
                except Exception as exc:  # a wake-up only makes a claim happen sooner
                    self._throttle.warn("announce", "ratchet: wake-up not sent: %s", exc)

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
        if queue == RESUBSCRIBED_WAKEUP:  # announcements missed: look at everything
            if self.control is not None:
                self.control.hint()
            self._masters_changed.set()
            self._revoke_hint.set()
            self.wake()
            return
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
        ended = threading.Event()

        def run() -> None:
            try:
                target()
            finally:
                ended.set()

        thread = background_thread(run, f"ratchet-{name}")
        self._ended[thread] = ended
        thread.start()
        self._threads.append(thread)

    def _wait_until_ended(self, thread: threading.Thread, timeout: float) -> None:
        """Until ``thread`` returned, or ``timeout`` seconds. Not ``Thread.join``: a stop
        signal's handler (a cold stop during a warm one) calls this while the main thread
        it interrupted may be inside a join of the same thread, and a join nested in that
        one waits out its whole timeout (the outer join holds the thread's lock)."""
        ended = self._ended[thread]
        deadline = self._clock.monotonic() + timeout
        while not ended.is_set() and self._clock.monotonic() < deadline:
            self._clock.sleep(0.01)

    def _confirmed(self, sent: float) -> None:
        """A heartbeat (or the registration) sent at ``sent`` went through: no node can
        declare this one dead before ``sent`` plus a grace period, as they judge it."""
        settings = self.settings
        limit = settings.node_orphan_grace_seconds - settings.node_heartbeat_interval_seconds
        with self._stale_lock:
            previous, self._last_heartbeat = self._last_heartbeat, sent
            now = self._clock.monotonic()
            again = self._stale and now - sent <= limit
            if again:
                self._stale = False
        if again:
            logger.warning(
                "ratchet: node %s wrote a heartbeat again, %.1fs after the last one before it; "
                "it claims and starts jobs again",
                self.node_id,
                now - previous,
            )
        if self.fence is not None:
            with self._lock:
                epoch = self._epoch
            self.fence.publish(self._fence_tag, epoch, sent + limit)

    def _lost_contact(self) -> None:
        with self._judge_lock:
            self._judge.lost_contact()

    def _stamped(self, claimed: list[ClaimedJob], epoch: int) -> list[ClaimedJob]:
        if self.fence is None:
            return claimed
        fence = stamp(self._fence_tag, epoch)
        return [job.with_fence(fence) for job in claimed]

    def _heartbeat_stale(self) -> bool:
        """No heartbeat written for so long that the cluster may have declared us dead and
        handed our claims to others: starting a claimed job now could run it twice."""
        settings = self.settings
        limit = settings.node_orphan_grace_seconds - settings.node_heartbeat_interval_seconds
        silent = self._clock.monotonic() - self._last_heartbeat
        if silent <= limit:
            return False
        with self._stale_lock:  # read again: a heartbeat may have gone through meanwhile
            silent = self._clock.monotonic() - self._last_heartbeat
            if silent <= limit:
                return False
            said, self._stale = self._stale, True
        if not said:
            logger.warning(
                "ratchet: node %s has written no heartbeat for %.1fs (ratchet_node_orphan_"
                "grace_seconds = %g less one heartbeat interval): other nodes may declare it "
                "dead and run its jobs, so it starts none of the jobs it claimed and claims "
                "nothing until a heartbeat goes through (the job store unreachable or not "
                "answering: see the lines before)",
                self.node_id,
                silent,
                settings.node_orphan_grace_seconds,
            )
        return True

    def _count_kind(self, job: ClaimedJob) -> None:
        if self.capacity.single_limit or self.capacity.batch_child_limit:
            child = job.batch_child
            self._kinds[job.job_id] = child
            self._kind_counts[child] += 1

    def _uncount_kind(self, job_id: str) -> None:
        child = self._kinds.pop(job_id, None)
        if child is not None:
            self._kind_counts[child] -= 1

    def wake(self) -> None:
        """New work may be due (an enqueue notification, recovered orphans): claim now."""
        self._ran_dry = False
        self._hint.set()
        self._wake.set()
