"""The worker's database side: claim, hand over, record outcomes, heartbeat, recover orphans.

Knows nothing of Celery: it is given a ``dispatch`` callable that starts one claimed job and
must eventually be told the outcome through :meth:`WorkerRuntime.settle`.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence

from celery_ratchet.domain.breaker import CircuitBreaker
from celery_ratchet.domain.control import CONTROL_WAKEUP
from celery_ratchet.domain.job import (
    RESUBSCRIBED_WAKEUP,
    REVOCATIONS_WAKEUP,
    SCHEDULES_QUEUE,
    ClaimedJob,
    JobStatus,
    Settlement,
)
from celery_ratchet.runtime.base import (
    SHUTDOWN_WRITE_SECONDS,
    BreakerLookup,
    Capacity,
    Intake,
    NodeEvents,
    OccurrenceFactory,
    WakeupSource,
    throttle_for,
)
from celery_ratchet.runtime.channel import Channel
from celery_ratchet.runtime.claiming import Claimer
from celery_ratchet.runtime.clock import SYSTEM_CLOCK, Clock
from celery_ratchet.runtime.control import CommandRunner, ControlLoop
from celery_ratchet.runtime.fence import Fence
from celery_ratchet.runtime.holdings import Holdings
from celery_ratchet.runtime.liveness import Heartbeat, Housekeeping, OrphanScan, PeerWatch
from celery_ratchet.runtime.masters import Masters
from celery_ratchet.runtime.node_clock import NodeClock
from celery_ratchet.runtime.outcomes import Settler
from celery_ratchet.runtime.queue_pauses import PausedQueues
from celery_ratchet.runtime.revocations import Revocations
from celery_ratchet.runtime.signal_relay import SignalRelay
from celery_ratchet.runtime.standing import Standing
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.control import control_store
from celery_ratchet.store.ports import WorkerStore
from celery_ratchet.threads import background_thread

logger = logging.getLogger(__name__)


class WorkerRuntime:
    """One node of the cluster and its lifecycle, composed of parts that each own a thread
    and its fields: the :class:`Claimer` (the claim loop, which fires the recurring
    :class:`Masters` too), the :class:`Settler`, the :class:`Heartbeat`, the
    :class:`OrphanScan`, the :class:`Revocations` and the :class:`Housekeeping`. What their
    threads share crosses only through the objects given to them: the :class:`Holdings`
    (the jobs held, behind one lock), the :class:`NodeEvents`, the :class:`Standing` (whether
    this node's claims are still its own), the :class:`PeerWatch`, the :class:`Channel` and
    the :class:`Intake` (queues and capacity, replaced whole)."""

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
        task_names: Sequence[str] | None = None,
        clock: NodeClock | None = None,
        local_clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id
        self.hostname = hostname or socket.gethostname()
        self._clock = local_clock
        self._throttle = throttle_for(settings, local_clock)
        self._pid = os.getpid()
        self._intake = Intake(queues, capacity)
        self._events = events = NodeEvents()
        self._holdings = holdings = Holdings()
        self._channel = channel = Channel(
            store, settings, wakeups, local_clock, throttle_for(settings, local_clock)
        )
        self._standing = standing = Standing(node_id, settings, local_clock, fence)
        peers = PeerWatch(settings.node_orphan_grace_seconds, node_id)
        self.settler = Settler(
            store, settings, holdings=holdings, events=events, intake=self._intake,
            channel=channel, clock=local_clock, throttle=throttle_for(settings, local_clock),
        )  # fmt: skip
        self.revocations = Revocations(
            store, settings, node_id=node_id, holdings=holdings, events=events,
            channel=channel, settler=self.settler, on_revoke=on_revoke,
            revoked_error=revoked_error, clock=local_clock,
            throttle=throttle_for(settings, local_clock),
        )  # fmt: skip
        self.masters: Masters | None = None
        if occurrence is not None:
            self.masters = Masters(
                store, settings, node_id=node_id, occurrence=occurrence, standing=standing,
                channel=channel, events=events, clock=local_clock,
                throttle=throttle_for(settings, local_clock),
            )  # fmt: skip
        self.claimer = Claimer(
            store, settings, node_id=node_id, intake=self._intake, dispatch=dispatch,
            breaker_for=breaker_for if settings.circuit_breaker else None,
            holdings=holdings, events=events, channel=channel, standing=standing,
            settler=self.settler, revocations=self.revocations, masters=self.masters,
            pauses=PausedQueues(store, local_clock, settings.queue_pause_check_seconds),
            clock=local_clock, throttle=throttle_for(settings, local_clock),
        )  # fmt: skip
        self.heartbeat = Heartbeat(
            store, settings, node_id=node_id, hostname=self.hostname,
            schedule_keys=list(schedule_keys), intake=self._intake, holdings=holdings,
            task_names=None if task_names is None else list(task_names),
            events=events, standing=standing, peers=peers, settler=self.settler,
            drop_buffer=self.claimer.drop_buffer, node_clock=clock, clock=local_clock,
            throttle=throttle_for(settings, local_clock),
        )  # fmt: skip
        self.orphan_scan = OrphanScan(
            store, settings, events=events, standing=standing, peers=peers, channel=channel,
            clock=local_clock, throttle=throttle_for(settings, local_clock),
        )  # fmt: skip
        self.housekeeping: Housekeeping | None = None
        if housekeeping is not None:
            self.housekeeping = Housekeeping(
                housekeeping, events, throttle_for(settings, local_clock)
            )
        #: Runs the remote control commands broadcast through the store (``celery inspect``).
        self.control: ControlLoop | None = None
        if control is not None:
            self.control = ControlLoop(
                control_store(store),
                control,
                hostname=self.hostname,
                poll_seconds=channel.control_poll,
            )
        #: What a stop signal's handler sets, set from a thread of its own.
        self._stop_relay = SignalRelay(events.stopping, events.woken, name="ratchet-stop-relay")
        #: The threads of this node, each with the event set when it returned (read without a
        #: lock: see _wait_until_ended); only the thread that starts or stops the node
        #: touches them.
        self._threads: list[threading.Thread] = []
        self._ended: dict[threading.Thread, threading.Event] = {}

    @property
    def queues(self) -> list[str]:
        return self._intake.queues

    @property
    def capacity(self) -> Capacity:
        return self._intake.capacity

    @property
    def wakeups(self) -> list[WakeupSource]:
        return self._channel.sources

    @property
    def breakers(self) -> dict[str, CircuitBreaker]:
        return self._holdings.breakers

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        self._stop_relay.start()
        registered = self.heartbeat.register()
        if registered is None:  # told to stop before it could register: claim nothing
            return
        for name, target in (
            ("poller", self.claimer.run),
            ("settler", self.settler.run),
            ("heartbeat", self.heartbeat.run),
            ("orphan-scan", self.orphan_scan.run),
            ("revocations", self.revocations.run),
            ("housekeeping", self.housekeeping.run if self.housekeeping else _no_work),
        ):
            self._spawn(name, target)
        if self.control is not None:
            # From the first registration, not from now: a job claimed meanwhile may already
            # be the subject of a broadcast (a revoke with terminate).
            self.control.start(since=registered)
        for source in self._channel.sources:
            source.start(self._woken)

    def resume(self) -> None:
        """Claim again after :meth:`stop_claiming` (the executor restarted)."""
        if self._events.closed.is_set() or not self._events.stopping.is_set():
            return
        self._threads = [t for t in self._threads if t.is_alive()]
        self._ended = {t: e for t, e in self._ended.items() if t in self._threads}
        running = {t.name for t in self._threads}
        if {"ratchet-poller", "ratchet-orphan-scan"} & running:
            logger.warning("ratchet: previous claim loop still stopping; not resuming yet")
            return
        self._events.stopping.clear()
        self._spawn("poller", self.claimer.run)
        self._spawn("orphan-scan", self.orphan_scan.run)

    def set_queues(self, queues: Sequence[str]) -> None:
        """Claim from ``queues`` from now on (``celery control add_consumer`` and
        ``cancel_consumer``); the node's row lists them."""
        self._intake.queues = list(queues)
        self.heartbeat.record_queues()
        logger.info("ratchet: node %s consuming %s", self.node_id, ",".join(self.queues))
        self.wake()

    def set_capacity(self, capacity: Capacity) -> None:
        """Take this much work from now on (the pool grew or shrank)."""
        self._intake.capacity = capacity
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
        elif not self._events.closed.is_set():  # not started: no thread of this node runs yet
            self._events.stopping.set()
            self._events.woken.set()

    def stop_claiming(self) -> list[ClaimedJob]:
        """Stop taking work and hand claimed-but-unstarted jobs back at once."""
        self._events.stopping.set()
        self._events.woken.set()
        for thread in self._threads:
            if thread.name == "ratchet-poller":
                self._wait_until_ended(thread, 30)
        unstarted = self._holdings.take_buffer()
        try:
            # As if never claimed, due when they were: a rolling restart that hands the same
            # job back from node after node does not count against ratchet_max_recoveries.
            if unstarted:
                self.store.defer([(j.job_id, j.token, j.scheduled_time) for j in unstarted])
                self._channel.announce(self._intake.queues)
        except Exception:  # unreachable or refused: the settler hands them back, or recovery
            for job in unstarted:
                self.settler.hand_back(job)
        if unstarted:
            logger.info("ratchet: handing back %d unstarted jobs", len(unstarted))
        return unstarted

    def hand_back(self, job_id: str) -> None:
        """A job handed to the executor that will never start it (it was closing): back to
        PENDING now."""
        token = self._holdings.token_of(job_id)
        if token is not None:
            self.settler.settle(Settlement(job_id, token, JobStatus.PENDING))
            logger.info("ratchet: handing back job %s, which the executor refused", job_id)

    def close(self, timeout: float = SHUTDOWN_WRITE_SECONDS) -> None:
        """After the executor has stopped: hand back what it never finished (jobs queued
        inside it that never started, or cut off by a cold stop), write the last outcomes,
        leave the cluster. Waits for those writes ``timeout`` seconds at most, and not at
        all once the store has refused one (unreachable): what is not written then stays
        RUNNING and comes back through orphan recovery."""
        if self._events.closed.is_set():
            return
        self.stop_claiming()
        closing = self._clock.monotonic()
        unfinished = self._holdings.take_unfinished()
        for job_id, token in unfinished:
            self.settler.report(
                self._holdings.with_permit(Settlement(job_id, token, JobStatus.PENDING))
            )
        if unfinished:
            logger.info(
                "ratchet: handing back %d jobs the executor did not finish", len(unfinished)
            )
        deadline = self._clock.monotonic() + timeout
        while self._holdings.unwritten_count() and self._clock.monotonic() < deadline:
            if self.settler.write_failed_at > closing + 1.0:  # unreachable, not a passing lock
                deadline = self._clock.monotonic() + 0.5
                break
            self._clock.sleep(0.05)
        self._events.closed.set()
        self._stop_relay.close()
        self.settler.close()
        for source in self._channel.sources:
            source.stop()
        if self.control is not None:
            self.control.close(timeout=max(0.1, deadline - self._clock.monotonic()))
        for thread in self._threads:
            self._wait_until_ended(thread, max(0.1, deadline - self._clock.monotonic()))
        left = self._holdings.unwritten_count()
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

    # -- outcomes (from the threads that run jobs; none blocks on the database) -------------

    def settle(self, settlement: Settlement) -> None:
        """Record the end of one dispatched job."""
        self.settler.settle(settlement)

    def report_result(self, settlement: Settlement) -> None:
        """Record a success with its result, written with the settler's next batch; its
        slot stays taken until :meth:`release` and the write (see Settler.report_result)."""
        self.settler.report_result(settlement)

    def release(self, job_id: str, token: str, *, due_again: bool = True) -> None:
        """Free the slot of a job whose row needs no write (see Settler.release)."""
        self.settler.release(job_id, token, due_again=due_again)

    def record_outcome(self, job_id: str, token: str, failed: bool) -> None:
        """Count a finished execution in its task's circuit breaker, if it has one."""
        self._holdings.count_outcome(job_id, token, failed, self._clock.monotonic())

    def wait_results_written(self, timeout: float) -> bool:
        """Wait until the results reported so far are written (False: still not, after
        ``timeout`` seconds). A success not written yet still holds its business key."""
        return self._holdings.wait_results_written(timeout)

    def keeps_outcomes_here(self) -> bool:
        """Whether an outcome reported from this process reaches this node's settler: the
        worker's own process (not a pool process's copy of the runtime), before it closed."""
        return os.getpid() == self._pid and not self._events.closed.is_set()

    def unwritten(self, job_id: str, token: str) -> bool:
        """Whether an outcome of this execution was reported and is not written yet."""
        return self._holdings.unwritten(job_id, token)

    # -- chain steps handed over within the node --------------------------------------------

    def accepts_chain_step(self, queue: str) -> int | None:
        """See :meth:`Claimer.accepts_chain_step`."""
        return self.claimer.accepts_chain_step(queue)

    def take_released(self, job: ClaimedJob, epoch: int) -> None:
        """See :meth:`Claimer.take_released`."""
        self.claimer.take_released(job, epoch)

    # -- wake-ups and threads ---------------------------------------------------------------

    def wake(self) -> None:
        """New work may be due (an enqueue notification, recovered orphans): claim now."""
        self._events.wake()

    def _woken(self, queue: str) -> None:
        """A job of ``queue`` was committed (claim now if it is one of ours), a recurring
        master changed, or running jobs were asked to stop."""
        if queue == RESUBSCRIBED_WAKEUP:  # announcements missed: look at everything
            if self.control is not None:
                self.control.hint()
            if self.masters is not None:
                self.masters.changed()
            self.revocations.hint()
            self.wake()
            return
        self._channel.heard.set()
        if queue == REVOCATIONS_WAKEUP:
            self.revocations.hint()
        elif queue == CONTROL_WAKEUP:
            if self.control is not None:
                self.control.hint()
        elif queue == SCHEDULES_QUEUE:
            if self.masters is not None:
                self.masters.changed()
                self._events.woken.set()
        elif queue in self._intake.queues:
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


def _no_work() -> None:
    """The housekeeping thread of a node given no housekeeping: returns at once."""
