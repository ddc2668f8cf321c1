"""A node's wake-up channel: whether changes are announced to it, the probe that finds out,
and the announcements it sends to the other nodes."""

from __future__ import annotations

import threading
from collections.abc import Sequence

from celery_ratchet.domain.job import PROBE_WAKEUP
from celery_ratchet.runtime.base import _PROBE_SECONDS, Throttle, WakeupSource
from celery_ratchet.runtime.clock import Clock
from celery_ratchet.settings import RatchetSettings
from celery_ratchet.store.ports import Announcing


class Channel:
    """Thread-safe, but for :meth:`probe`, which only the claim loop calls."""

    def __init__(
        self,
        store: Announcing,
        settings: RatchetSettings,
        sources: Sequence[WakeupSource],
        clock: Clock,
        throttle: Throttle,
    ) -> None:
        self._store = store
        self._settings = settings
        self.sources = list(sources)
        self._clock = clock
        self._throttle = throttle
        #: An announcement reached this node: the channel delivers (a LISTEN behind a
        #: transaction-pooling PgBouncer subscribes, yet hears nothing).
        self.heard = threading.Event()
        self._next_probe = 0.0  # the claim loop's

    def subscribed(self) -> bool:
        return any(getattr(source, "live", True) for source in self.sources)

    def told(self) -> bool:
        """Whether changes are announced to this node now: a wake-up channel is subscribed
        and has delivered (the node's own probe, or any announcement)."""
        return self.heard.is_set() and self.subscribed()

    def idle_look(self) -> float:
        """Longest idle wait between two looks at the store: while changes are announced,
        only the safety net for a lost notification."""
        if self.told():
            return self._settings.wakeup_poll_interval
        return self._settings.poll_interval

    def control_poll(self) -> float:
        """Longest wait between two looks for control commands: while broadcasts are
        announced, only the safety net for a lost notification."""
        if self.told():
            return self._settings.wakeup_poll_interval
        return self._settings.control_poll_interval

    def probe(self) -> None:
        """Subscribed but never told anything yet: send a probe on every channel (on
        PostgreSQL from the store's connection, not the listening one), now and then."""
        now = self._clock.monotonic()
        if self.heard.is_set() or now < self._next_probe or not self.subscribed():
            return
        self._next_probe = now + _PROBE_SECONDS
        try:
            self._store.announce(PROBE_WAKEUP)
        except Exception as exc:
            self._throttle.warn("announce", "ratchet: wake-up not sent: %s", exc)
        self.announce([PROBE_WAKEUP])

    def announce(self, words: Sequence[str]) -> None:
        for source in self.sources:
            announce = getattr(source, "announce", None)
            if announce is not None:
                try:
                    announce(words)
                except Exception as exc:  # a wake-up only makes a claim happen sooner
                    self._throttle.warn("announce", "ratchet: wake-up not sent: %s", exc)
