"""Whether a node's claims are still its own: when its last heartbeat went through, and
the fence its executing processes read that from."""

from __future__ import annotations

import logging
import threading

from celery_ratchet.domain.job import ClaimedJob
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.runtime.fence import Fence, new_tag, stamp
from celery_ratchet.settings import RatchetSettings

logger = logging.getLogger(__name__)


class Standing:
    """Written by the thread that registers and heartbeats; read by every thread that claims
    or starts jobs. Thread-safe."""

    def __init__(
        self, node_id: str, settings: RatchetSettings, clock: Clock, fence: Fence | None
    ) -> None:
        self._node_id = node_id
        self._settings = settings
        self._clock = clock
        #: Where the executing processes read whether this node's claims are still its own.
        self.fence = fence
        self._fence_tag = new_tag()
        self._lock = threading.Lock()
        #: When the last heartbeat that went through was sent (monotonic).
        self._last_heartbeat = clock.monotonic()
        #: Whether this node's heartbeat was found stale, and said so (see stale()).
        self._stale = False

    @property
    def _limit(self) -> float:
        """How long without a heartbeat before other nodes may take this one for dead."""
        settings = self._settings
        return settings.node_orphan_grace_seconds - settings.node_heartbeat_interval_seconds

    def confirmed(self, sent: float, epoch: int) -> None:
        """A heartbeat (or the registration) sent at ``sent`` went through: no node can
        declare this one dead before ``sent`` plus a grace period, as they judge it."""
        limit = self._limit
        with self._lock:
            previous, self._last_heartbeat = self._last_heartbeat, sent
            now = self._clock.monotonic()
            again = self._stale and now - sent <= limit
            if again:
                self._stale = False
        if again:
            logger.warning(
                "ratchet: node %s wrote a heartbeat again, %.1fs after the last one before it; "
                "it claims and starts jobs again",
                self._node_id,
                now - previous,
            )
        if self.fence is not None:
            self.fence.publish(self._fence_tag, epoch, sent + limit)

    def declared_dead(self) -> None:
        """The cluster took this node for dead: no claim of before may start any more."""
        if self.fence is not None:
            self.fence.publish(self._fence_tag, -1, 0.0)

    def stamped(self, claimed: list[ClaimedJob], epoch: int) -> list[ClaimedJob]:
        if self.fence is None:
            return claimed
        fence = stamp(self._fence_tag, epoch)
        return [job.with_fence(fence) for job in claimed]

    def stale(self) -> bool:
        """No heartbeat written for so long that the cluster may have declared us dead and
        handed our claims to others: starting a claimed job now could run it twice."""
        limit = self._limit
        silent = self._clock.monotonic() - self._last_heartbeat
        if silent <= limit:
            return False
        with self._lock:  # read again: a heartbeat may have gone through meanwhile
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
                self._node_id,
                silent,
                self._settings.node_orphan_grace_seconds,
            )
        return True
