"""A node's registration and liveness, and its peers': heartbeats, claims reconciled, dead
nodes' jobs taken back, housekeeping."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from datetime import datetime

from celery_ratchet.domain.job import JobStatus, Settlement
from celery_ratchet.domain.liveness import LivenessJudge
from celery_ratchet.runtime.base import HOUSEKEEPING_INTERVAL, Intake, NodeEvents, Throttle
from celery_ratchet.runtime.channel import Channel
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.runtime.holdings import Holdings
from celery_ratchet.runtime.node_clock import NodeClock
from celery_ratchet.runtime.outcomes import Settler
from celery_ratchet.runtime.standing import Standing
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import NodeStore, WorkerStore

logger = logging.getLogger(__name__)


class PeerWatch:
    """Which other nodes are dead, from heartbeats this node saw not advance: written by the
    heartbeat thread, read by the orphan scan. Thread-safe."""

    def __init__(self, grace_seconds: float, node_id: str) -> None:
        self._judge: LivenessJudge[datetime] = LivenessJudge(grace_seconds, node_id)
        self._lock = threading.Lock()

    def observe(self, heartbeats: Mapping[str, datetime], now: float) -> None:
        with self._lock:
            self._judge.observe(dict(heartbeats), now)

    def lost_contact(self) -> None:
        with self._lock:
            self._judge.lost_contact()

    def verdict(self, now: float) -> tuple[bool, dict[str, datetime]]:
        """Whether this node may judge others now, and the nodes it saw stand still."""
        with self._lock:
            return self._judge.may_judge(now), self._judge.silent(now)


class Heartbeat:
    """Owns the node's registration and the heartbeat thread: registers, beats, watches the
    other nodes' heartbeats, reconciles this node's claims, and registers again when the
    cluster declared it dead."""

    def __init__(
        self,
        store: WorkerStore,
        settings: RatchetSettings,
        *,
        node_id: str,
        hostname: str,
        schedule_keys: list[str],
        intake: Intake,
        task_names: list[str] | None = None,
        holdings: Holdings,
        events: NodeEvents,
        standing: Standing,
        peers: PeerWatch,
        settler: Settler,
        drop_buffer: Callable[[str], None],
        node_clock: NodeClock | None,
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self.store = store
        self.settings = settings
        self.node_id = node_id
        self.hostname = hostname
        self.schedule_keys = schedule_keys
        self.task_names = task_names
        self._intake = intake
        self._holdings = holdings
        self._events = events
        self._standing = standing
        self._peers = peers
        self._settler = settler
        self._drop_buffer = drop_buffer
        self._node_clock = node_clock
        self._clock = clock
        self._throttle = throttle

    def register(self) -> datetime | None:
        """Register this node, retrying until it goes through; returns when it was
        registered (database clock), or None when told to stop first."""
        stopping = self._events.stopping
        while not stopping.is_set():
            sent = self._clock.monotonic()
            try:
                registered = self.store.register_node(
                    self.node_id,
                    self.hostname,
                    os.getpid(),
                    self._intake.queues,
                    self._intake.capacity.executing,
                    self.schedule_keys,
                    self.task_names,
                )
                self._standing.confirmed(sent, self._holdings.registered())
                logger.info(
                    "ratchet: node %s consuming %s from %s",
                    self.node_id,
                    ",".join(self._intake.queues),
                    self.store.display_url,
                )
                if self._node_clock is not None:
                    self._node_clock.measure()  # a clock far off is said at start
                return registered
            except Exception as exc:
                self._peers.lost_contact()
                self._throttle.warn("register", "ratchet: node not registered: %s; retrying", exc)
                stopping.wait(self.settings.poll_interval)
        return None

    def run(self) -> None:
        """The heartbeat thread, until the node closes."""
        while not self._events.closed.wait(self.settings.node_heartbeat_interval_seconds):
            self.beat()

    def beat(self) -> None:
        """One heartbeat, then the claim check."""
        sent = self._clock.monotonic()
        try:
            alive = self.store.heartbeat(self.node_id)
        except Exception as exc:
            self._peers.lost_contact()
            self._throttle.warn("heartbeat", "ratchet: heartbeat failed: %s", exc)
            return
        if alive:
            self._standing.confirmed(sent, self._holdings.epoch)
            self._throttle.clear("heartbeat", "ratchet: heartbeat written again")
            self.record_queues()
            self._watch_others()
            if self._node_clock is not None:
                self._node_clock.measure_when_due()
        else:
            self._declared_dead()
        self.reconcile()

    def record_queues(self) -> None:
        """List the node's queues in its row, and let go of the jobs handed to it in a
        queue it left, unless that is done already. Until it is, other nodes would hand
        it jobs of a queue it no longer serves, and the jobs handed to it there would wait
        for as long as it lives: so each heartbeat tries again."""
        try:
            self._intake.record_queues(
                lambda queues: self.store.set_node_queues(self.node_id, queues)
            )
        except Exception as exc:  # claims use the new queues already; the row is behind
            self._throttle.warn(
                "queues", "ratchet: node queues not recorded: %s; tried again with each heartbeat",
                exc,
            )  # fmt: skip
            return
        self._throttle.clear("queues", "ratchet: node queues recorded")

    def _declared_dead(self) -> None:
        """The cluster declared this node dead and gave its jobs to others: nothing it holds
        may start any more (the buffer is dropped, the executing processes check each claim
        before starting one), and it registers again."""
        self._standing.declared_dead()
        logger.error(
            "ratchet: node %s was declared dead by the cluster (no heartbeat seen for %ss); "
            "its jobs may run again elsewhere. Dropping what it holds, registering again.",
            self.node_id,
            self.settings.node_orphan_grace_seconds,
        )
        self._drop_buffer("this node was declared dead; its claims went to others")
        self.register()

    def _watch_others(self) -> None:
        """Read every node's heartbeat: the orphan scan declares dead only nodes whose
        heartbeat this node saw stand still for a full grace period."""
        try:
            heartbeats = self.store.node_heartbeats()
        except Exception as exc:
            self._peers.lost_contact()
            self._throttle.warn("heartbeat", "ratchet: heartbeats not read: %s", exc)
            return
        self._peers.observe(heartbeats, self._clock.monotonic())

    def reconcile(self) -> None:
        """Hand back rows this node holds RUNNING but no longer knows about (a claim whose
        reply was lost, an outcome that could not be written): a live node's claims are
        never recovered by the orphan scan, so they would stay RUNNING forever."""
        age = 2 * self.settings.node_heartbeat_interval_seconds
        try:
            held = self.store.running_claims(self.node_id, older_than_seconds=age)
        except Exception as exc:
            self._throttle.warn("reconcile", "ratchet: claim check failed: %s", exc)
            return
        known = self._holdings.known_claims()
        strays = [claim for claim in held if claim not in known]
        for job_id, token in strays:
            self._settler.report(Settlement(job_id, token, JobStatus.PENDING))
        if strays:
            logger.warning(
                "ratchet: handing back %d claims this node had lost track of: %s",
                len(strays),
                ", ".join(j for j, _ in strays[:20]),
            )


class OrphanScan:
    """Owns the orphan-scan thread: takes the jobs of dead nodes back. A node that was itself
    cut off from the database (or has just started) judges nobody until it has watched the
    others' heartbeats for a full grace period; a node is dead only if its heartbeat did not
    advance all that time."""

    def __init__(
        self,
        store: NodeStore,
        settings: RatchetSettings,
        *,
        events: NodeEvents,
        standing: Standing,
        peers: PeerWatch,
        channel: Channel,
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self.store = store
        self.settings = settings
        self._events = events
        self._standing = standing
        self._peers = peers
        self._channel = channel
        self._clock = clock
        self._throttle = throttle

    def run(self) -> None:
        """The orphan-scan thread, until the node stops claiming."""
        while not self._events.stopping.wait(self.settings.orphan_scan_interval):
            self.scan()

    def scan(self) -> None:
        settings = self.settings
        may_judge, silent = self._peers.verdict(self._clock.monotonic())
        if not may_judge or self._standing.stale():
            return
        try:
            recovered = self.store.recover_orphans(
                settings.node_orphan_grace_seconds,
                observed=silent,
                max_recoveries=settings.max_recoveries,
            )
        except Exception as exc:
            self._peers.lost_contact()
            self._throttle.warn("orphans", "ratchet: orphan scan failed: %s", exc)
            return
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
            self._channel.announce(recovered.queues)  # the other nodes (PostgreSQL: notified)
            self._events.wake()


class Housekeeping:
    """Owns the housekeeping thread: calls ``task`` every HOUSEKEEPING_INTERVAL (finishing
    batches cut short by a dead node) until the node stops claiming."""

    def __init__(self, task: Callable[[], object], events: NodeEvents, throttle: Throttle) -> None:
        self._task = task
        self._events = events
        self._throttle = throttle

    def run(self) -> None:
        while not self._events.stopping.wait(HOUSEKEEPING_INTERVAL):
            try:
                self._task()
            except Exception as exc:
                self._throttle.warn("housekeeping", "ratchet: housekeeping failed: %s", exc)
