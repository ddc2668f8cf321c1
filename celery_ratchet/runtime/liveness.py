"""A node's registration and liveness, and its peers': heartbeats, claims reconciled,
dead nodes' jobs taken back, housekeeping."""

from __future__ import annotations

import logging
import os
from datetime import datetime

from celery_ratchet.domain.job import (
    JobStatus,
    Settlement,
)
from celery_ratchet.runtime.base import (
    HOUSEKEEPING_INTERVAL,
)
from celery_ratchet.runtime.claiming import Claiming

logger = logging.getLogger(__name__)


class Liveness(Claiming):
    """A node's registration and liveness, and its peers': heartbeats, claims reconciled,
    dead nodes' jobs taken back, housekeeping."""

    def _register(self) -> datetime | None:
        """Register this node, retrying until it goes through; returns when it was
        registered (database clock), or None when told to stop first."""
        while not self._stopping.is_set():
            sent = self._clock.monotonic()
            try:
                registered = self.store.register_node(
                    self.node_id,
                    self.hostname,
                    os.getpid(),
                    self.queues,
                    self.capacity.executing,
                    self.schedule_keys,
                )
                with self._lock:
                    self._epoch += 1
                self._confirmed(sent)
                logger.info(
                    "ratchet: node %s consuming %s from %s",
                    self.node_id,
                    ",".join(self.queues),
                    self.store.display_url,
                )
                if self.clock is not None:
                    self.clock.measure()  # a clock far off is said at start
                return registered
            except Exception as exc:
                self._lost_contact()
                self._throttle.warn("register", "ratchet: node not registered: %s; retrying", exc)
                self._stopping.wait(self.settings.poll_interval)
        return None

    def _heartbeat_loop(self) -> None:
        interval = self.settings.node_heartbeat_interval_seconds
        while not self._closed.wait(interval):
            sent = self._clock.monotonic()
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
                if self.clock is not None:
                    self.clock.measure_when_due()
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
            self._judge.observe(heartbeats, self._clock.monotonic())

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
            now = self._clock.monotonic()
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
                self._announce(recovered.queues)  # the other nodes (PostgreSQL: notified)
                self.wake()
