"""Optional wake-ups: a new job wakes idle workers at once instead of at their next poll.

Two sources, each a thread on the worker that calls ``wake(queue)``: PostgreSQL's
LISTEN/NOTIFY (the enqueue INSERT notifies, see ``JobStore.notify``) and Redis pub/sub
(``ratchet_events_url``; the sender publishes after the row is committed). Without either,
polling alone is correct: a wake-up only makes a claim happen sooner.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from celery_ratchet.domain.job import RESUBSCRIBED_WAKEUP
from celery_ratchet.threads import background_thread

logger = logging.getLogger(__name__)

Wake = Callable[[str], None]


class ListenerThread:
    """A daemon thread that keeps one subscription alive, reconnecting with backoff."""

    name = "wakeups"

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.thread: threading.Thread | None = None
        self._last_warning = 0.0
        #: Subscribed, so that announcements arrive: set by ``listen`` once it is, cleared
        #: when the subscription is lost. Meanwhile the worker polls at its poll interval.
        self.live = False
        self._lost = False

    def start(self, wake: Wake) -> None:
        self.thread = background_thread(self._run, f"ratchet-{self.name}", args=(wake,))
        self.thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self.thread is not None:
            self.thread.join(timeout=5)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def subscribed(self, wake: Wake) -> None:
        """Called by :meth:`listen` once announcements arrive. After a subscription was
        lost, what was announced meanwhile was missed: the node is told to look."""
        self.live = True
        if self._lost:
            self._lost = False
            wake(RESUBSCRIBED_WAKEUP)

    def _unsubscribed(self, wake: Wake) -> bool:
        """The subscription ended; whether it had been live (the node, told, falls back to
        polling until it is back)."""
        was_live, self.live = self.live, False
        if was_live:
            self._lost = True
            wake(RESUBSCRIBED_WAKEUP)
        return was_live

    def _run(self, wake: Wake) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                self.listen(wake)
                self._unsubscribed(wake)
                delay = 0.5
            except Exception as exc:
                if self._unsubscribed(wake):
                    delay = 0.5  # a connection that worked was lost: back at once
                now = time.monotonic()
                if now - self._last_warning > 60:
                    self._last_warning = now
                    logger.warning(
                        "ratchet: %s lost (%s); polling meanwhile, reconnecting", self.name, exc
                    )
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)

    def listen(self, wake: Wake) -> None:
        """Subscribe and call ``wake`` per message until stopped; raise on a lost connection."""
        raise NotImplementedError
