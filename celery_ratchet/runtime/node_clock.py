"""This node's clock, corrected to the database's: the one clock relative delays are
resolved on (a countdown, a retry's countdown, ratchet's own backoff, a schedule's next
fire time), so that a node whose clock is off does not run jobs early or move schedules."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Protocol

from celery_ratchet.domain.clock import offset_seconds, skew_to_report
from celery_ratchet.runtime.clock import SYSTEM_CLOCK, Clock

logger = logging.getLogger(__name__)

#: How long a measured offset is used before it is measured again (seconds, monotonic).
REMEASURE_SECONDS = 60.0
#: A read of the database's time slower than this (seconds) is made again.
SLOW_READ_SECONDS = 0.05


class DatabaseTime(Protocol):
    def database_time(self) -> datetime | None: ...


class NodeClock:
    """The node's UTC clock plus its measured offset from the database's clock, measured
    again at most every ``REMEASURE_SECONDS`` when asked (a worker's heartbeat asks).
    A node whose offset is beyond ``warn_beyond`` seconds logs a WARNING saying by how
    much, once, and again when the offset moves materially."""

    def __init__(
        self, store: DatabaseTime, warn_beyond: float, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._store = store
        self._clock = clock
        self.warn_beyond = warn_beyond
        #: Seconds the database's clock is ahead of this node's; None: not measured yet.
        self._offset: float | None = None
        self._measured_at = 0.0
        self._reported: float | None = None

    @property
    def offset(self) -> float | None:
        return self._offset

    def now(self) -> datetime:
        """The database's time now, as this node reckons it; the node's own clock when the
        database cannot be read (the send then fails or succeeds on its own terms)."""
        self.measure_when_due()
        local = self._clock.now()
        return local if self._offset is None else local + timedelta(seconds=self._offset)

    def _read(self) -> float | None:
        sent = self._clock.now()
        db_time = self._store.database_time()
        return None if db_time is None else offset_seconds(sent, db_time)

    def measure_when_due(self) -> None:
        """Measure the offset if it never was, or not for ``REMEASURE_SECONDS``."""
        if self._offset is None or self._clock.monotonic() - self._measured_at > REMEASURE_SECONDS:
            self.measure()

    def measure(self) -> float | None:
        """Read the database's time and record the offset (and warn if it is too large);
        returns the offset, or None when the database could not be read."""
        started = self._clock.monotonic()
        try:
            offset = self._read()
            if offset is not None and self._clock.monotonic() - started > SLOW_READ_SECONDS:
                # A slow read (the first one connects) is later by its round trip: read
                # again on the connection now open, and keep the tighter of the two.
                again = self._read()
                offset = offset if again is None else min(offset, again)
        except Exception as exc:  # the caller's own statement will say what is wrong
            logger.debug("ratchet: the database's time was not read: %s", exc)
            self._measured_at = started  # not again at every send while it is down
            return None
        if offset is None:  # the database's clock is this host's
            self._offset, self._measured_at = 0.0, started
            return 0.0
        # No lock: a pool process forked while one was held would wait on it for ever; two
        # threads measuring at once may at worst both warn.
        self._offset, self._measured_at = offset, started
        if skew_to_report(offset, self.warn_beyond, self._reported):
            self._reported = offset
            logger.warning(
                "ratchet: this node's clock is %.1fs %s the database's (more than "
                "ratchet_clock_skew_warning_seconds = %g): countdowns, retries and "
                "schedules are reckoned on the database's clock, but an absolute eta= "
                "sent from here is this clock's time, and logs and events carry it; "
                "synchronize this host's clock (NTP)",
                abs(offset),
                "behind" if offset > 0 else "ahead of",
                self.warn_beyond,
            )
        elif abs(offset) <= self.warn_beyond and self._reported is not None:
            self._reported = None
            logger.info(
                "ratchet: this node's clock is within %.1fs of the database's again",
                abs(offset),
            )
        return offset
